"""The papers' claims as targets of the workflow (``snakemake all_claims``, ``claims_<paper>``):
configurations and seeds' params (:mod:`.configs`), each seed's values (:mod:`.collect`), the
verdicts with Holm over a paper's claims (:mod:`.verdicts`), the pages (:mod:`.pages`,
:mod:`.summary`). The DAG's side is ``workflow/rules/claims.smk``."""

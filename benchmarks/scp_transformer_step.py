"""self-critical.pytorch's (SCP) `transformer` through the peers folder's ``scp_step.py``, unchanged.

``scp_step.py`` times SCP's ``updown`` and ``newfc``; this runs it as it is, but with SCP's own
option parser (``captioning.utils.opts.parse_opt``) wrapped so that the model it builds is SCP's
``caption_model transformer`` at the given sizes (``N_enc = N_dec``, ``d_model``, ``num_att_heads``,
``d_ff``, ``dropout``: the keys of SCP's configs/transformer/transformer.yml, which its ``--cfg``
would set the same way). Everything else is scp_step.py's: data, batches, the step (forward,
backward, clipping, Adam; SCST: 5 samples, greedy baseline, CIDEr-D), max length 16, timing.
Nothing of SCP is copied or imported into caprl; SCP's code runs from the extracted ``scp_py.tgz``.

  python benchmarks/scp_transformer_step.py PEERS/self-critical.pytorch/scp_step.py scst \\
      --layers 6 --d-model 512 --heads 8 --d-ff 2048 --name scst-transformer \\
      --batch 10 --threads 1 --data /tmp/cmp/scp-data --scp /tmp/cmp/scp

(``PYTHONPATH`` holding the extracted SCP and the peers' ``shims/``, as for scp_step.py.) Prints
scp_step.py's ``RESULT {json}`` line with ``config`` set to ``--name`` and the model's parameter count.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import runpy
import sys
from typing import Any


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("scp_step", help="the peers folder's self-critical.pytorch/scp_step.py")
    p.add_argument("objective", choices=["xe", "scst"])
    p.add_argument("--layers", type=int, default=6, help="N_enc = N_dec")
    p.add_argument("--d-model", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--d-ff", type=int, default=2048)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--name", default=None, help="the RESULT line's config (default OBJECTIVE-transformer)")
    p.add_argument("--scp", default="/tmp/scp", help="the extracted scp_py.tgz (passed on to scp_step.py)")
    a, rest = p.parse_known_args()
    sys.path[:0] = [os.path.abspath(a.scp), os.path.join(os.path.dirname(os.path.abspath(a.scp_step)), "shims")]
    import captioning.models as models
    import captioning.utils.opts as opts

    sizes = {"N_enc": a.layers, "N_dec": a.layers, "d_model": a.d_model, "num_att_heads": a.heads,
             "d_ff": a.d_ff, "dropout": a.dropout}
    parse_opt, setup = opts.parse_opt, models.setup
    built: list[Any] = []

    def transformer_opt() -> Any:
        opt = parse_opt()
        opt.caption_model = "transformer"
        for key, value in sizes.items():
            setattr(opt, key, value)
        return opt

    def keep(opt: Any) -> Any:
        built.append(setup(opt))
        return built[-1]

    opts.parse_opt, models.setup = transformer_opt, keep
    # scp_step.py's topdown slot: its data (regions and pooled) and options; the model is replaced above
    sys.argv = [a.scp_step, f"{a.objective}-topdown", "--scp", a.scp, *rest]
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured):
            runpy.run_path(a.scp_step, run_name="__main__")
    finally:
        for line in captured.getvalue().splitlines():
            if line.startswith("RESULT "):
                res = json.loads(line[len("RESULT "):])
                res["config"] = a.name or f"{a.objective}-transformer"
                res["arch"] = type(built[-1]).__name__ if built else None
                res["params"] = sum(q.numel() for q in built[-1].parameters()) if built else None
                res["sizes"] = sizes
                line = "RESULT " + json.dumps(res)
            print(line)


if __name__ == "__main__":
    main()

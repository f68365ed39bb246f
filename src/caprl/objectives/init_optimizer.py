"""Where the Adam of a run that starts from other runs' weights (``init``) starts: option
``init_optimizer``, a name of :data:`INIT_OPTIMIZERS`, applied once before the first step of a
fresh run (a resumed run reads its own state from ``last.pt``; a run with no ``init`` starts empty).

* ``carry``: each optimiser group named after an init role (``model``, ``listener``, ``value``: the
  group names of :meth:`caprl.objectives.base.Objective.param_groups`) takes the Adam state of the
  group of that name in the checkpoint the role starts from (the init run's ``best.pt``, which
  holds the optimiser state of the epoch whose weights it holds): the moments ``exp_avg``,
  ``exp_avg_sq`` and the step count (the bias correction goes on from there). The rates, betas
  and eps stay this run's (its options and schedule). A group with no init (a new baseline MLP),
  or whose source run did not train that module (no group of that name there: it was frozen),
  starts empty.
* ``fresh``: every group starts empty (a new ``torch.optim.Adam``).

What the sources do (the default in params.yaml per method):

* self-critical.pytorch (SCP), tools/train.py: with ``--start_from DIR`` it loads
  ``DIR/optimizer.pth`` if the file exists; ``captioning/utils/misc.py`` ``save_checkpoint`` writes
  ``optimizer%s.pth % append`` (``optimizer.pth``, and ``optimizer-best.pth`` for the best), a name
  without the run's ``id`` (only ``infos_<id>.pkl`` and ``histories_<id>.pkl`` carry it). Its RL
  configs (configs/fc_rl.yml, updown/updown_sc.yml, transformer/transformer_sc.yml, the ``*_nsc.yml``)
  set no ``id`` nor ``start_from``; the README's procedure copies the XE folder
  (scripts/copy_model.sh renames ``infos_<xe>.pkl`` to the RL id) and passes ``--start_from`` it:
  the XE run's last Adam state is carried, and the RL learning rate set over it (``set_lr`` at
  every epoch start; for the transformer, ``ReduceLROnPlateau.load_state_dict`` loads the NoamOpt
  Adam's state and sets the option's rate; torch's ``load_state_dict`` also restores the saved
  betas and eps, which stay this run's here). So SCP's practice is ``carry``.
* Stack-Captioning (paper 000), train.py: ``optimizer.load_state_dict(torch.load(start_from/optimizer.pth))``
  whenever ``--start_from`` is given; train.sh's RL stage passes the XE checkpoint folder: ``carry``.
* CooperativeImageCaptioning (paper 004), optimizer.py ``load_optimizer``: the joint (alternating)
  runs load the speaker's Adam from ``--speaker_stage_2_optimizer_path`` (bash_scripts/run_joint.sh:
  the XE run's ``log_att/optimizer.pth``) and the listener's from the listener pre-training's folder
  (``optimizer.pth`` next to ``--initialize_retrieval``); phase 3 (Luo et al.'s REINFORCE) loads
  ``start_from/optimizer.pth`` of the copied XE folder: ``carry``. (Luo et al.'s own
  DiscCaptioning, train.py, loads ``optimizer.pth`` only if ``len(saved['state']) ==
  len(optimizer.state_dict()['state'])``, which a new Adam's empty state never equals for a trained
  one: it re-initialises, effectively ``fresh``.)
* caption_competition (paper 002): a run started from ``model_file`` restores the MODEL_VARIABLES
  only (tf_expr_framework model/trntst.py ``_restore``; model/module.py's saver saves only those),
  so Adam's slots start anew: ``fresh``.
* Papers 001 and 003 have no public code: SCP's practice, ``carry``.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from caprl.errors import CaprlError
from caprl.registry import Registry

__all__ = ["INIT_OPTIMIZERS", "carry", "fresh"]

#: (this run's optimiser, init role -> checkpoint path, path -> the optimiser state it holds or None)
#: -> the groups whose state was carried
InitOptimizer = Callable[[torch.optim.Optimizer, dict[str, str], Callable[[str], "dict[str, Any] | None"]], list[str]]
INIT_OPTIMIZERS: Registry[InitOptimizer] = Registry("init_optimizer")


@INIT_OPTIMIZERS.register("fresh")
def fresh(optimizer: torch.optim.Optimizer, inits: dict[str, str],
          read: Callable[[str], dict[str, Any] | None]) -> list[str]:
    """Every group starts empty: nothing is read."""
    return []


@INIT_OPTIMIZERS.register("carry")
def carry(optimizer: torch.optim.Optimizer, inits: dict[str, str],
          read: Callable[[str], dict[str, Any] | None]) -> list[str]:
    """Each group named after an init role takes the state of the same-named group of the role's
    checkpoint (the module docstring); a checkpoint with no optimiser state, or a group of other
    parameters, is a CaprlError naming the file."""
    mine = optimizer.state_dict()
    params = [p for group in optimizer.param_groups for p in group["params"]]  # state_dict's index order
    state = dict(mine["state"])
    carried = []
    for group in mine["param_groups"]:
        role = group.get("name")
        if role not in inits:
            continue
        path = inits[role]
        theirs = read(path)
        if theirs is None:
            raise CaprlError(f"{path} holds no optimiser state (it was written before checkpoints kept it): "
                             "retrain its run, or set this run's init_optimizer: fresh")
        same = [g for g in theirs["param_groups"] if g.get("name") == role]
        if not same:
            continue  # the source run did not train this module
        source = same[0]["params"]
        if len(source) != len(group["params"]):
            raise CaprlError(f"{path}: its optimiser group '{role}' has {len(source)} parameters, this run's "
                             f"{len(group['params'])}: not the same module; set init_optimizer: fresh")
        for index, theirs_index in zip(group["params"], source):
            moments = theirs["state"].get(theirs_index)
            if moments is None:
                continue  # never stepped there
            shape, want = tuple(moments["exp_avg"].shape), tuple(params[index].shape)
            if shape != want:
                raise CaprlError(f"{path}: Adam's moments of group '{role}' have shape {shape}, this run's "
                                 f"parameter {want}: not the same module; set init_optimizer: fresh")
            state[index] = {k: v.clone() if isinstance(v, torch.Tensor) else v for k, v in moments.items()}
        carried.append(role)
    if carried:
        rates = [group["lr"] for group in optimizer.param_groups]  # a captured step's rate tensors: kept
        optimizer.load_state_dict({"state": state, "param_groups": mine["param_groups"]})  # casts to each param
        for group, rate in zip(optimizer.param_groups, rates):
            group["lr"] = rate
    return carried

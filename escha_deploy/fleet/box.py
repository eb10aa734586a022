"""``fleet up --box NAME``: start one box's server exactly as ``escha-deploy up`` does, with the
box's profile and overrides; run it on that box (the plan reads this machine's facts there).
"""

from __future__ import annotations

from ..utils.errors import Refused
from .model import LoadedFleet
from .plan import FleetPlan


def box_profile(loaded: LoadedFleet, fp: FleetPlan, name: str) -> tuple[str, list[str], str | None]:
    """``(profile ref, overrides, facts file)`` that ``up`` gets for box ``name``: the facts file
    is the box's ``facts`` (the file ``fleet plan`` planned it from, so ``up`` reaches the same
    plan digest), ``None`` without one (``up`` plans the machine it runs on). ``Refused`` for a
    box in no group or a node of a multi-node instance (its container comes from ``fleet compose``)."""
    box = loaded.fleet.box(name)
    bp = fp.box_plan(name)
    inst = next((i for i in loaded.fleet.instances() if name in i.boxes), None)
    if inst is None:
        raise Refused(f"box {name} is in no group of {loaded.path}: it serves nothing")
    if inst.multi_node:
        raise Refused(f"box {name} is node {bp.node_rank} of the multi-node instance {inst.name}: start it with "
                      f"the compose file `escha-deploy fleet compose {loaded.path}` renders for it")
    return loaded.profile_ref(box), list(box.set), str(loaded.resolve(box.facts)) if box.facts else None


def up_box(loaded: LoadedFleet, fp: FleetPlan, name: str, *, timeout_s: float | None = None, report=None):
    """``launch.up.up`` (what ``escha-deploy up`` calls) for box ``name``, with its profile and
    its ``set`` overrides; returns its ``UpResult``. A node of a multi-node instance is refused:
    its container comes from ``fleet compose`` (one service per node with the node's rank)."""
    from ..doctor.doctor_probe import doctor_in_image
    from ..launch.up import up

    ref, sets, facts = box_profile(loaded, fp, name)
    kwargs = {"report": report} if report is not None else {}
    return up(ref, sets, timeout_s=timeout_s, facts_path=facts, doctor_probe=doctor_in_image, **kwargs)

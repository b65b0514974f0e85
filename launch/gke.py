"""A GKE JobSet manifest that runs the launcher's command on every TPU host.

``python -m launch.tpu --gke_manifest --name=... --accelerator_type=v5p-128
--config=... --workdir=gs://...`` prints it; ``kubectl apply -f -`` runs it.
The template is ``launch/gke/jobset.yaml``; the pods run the same script as
the gcloud path (``gcloud.remote_script``): clone at the commit, install,
``python3 -m bertjax.main --distributed``.
"""

from __future__ import annotations

import json
import os
import string

from launch import topologies

TEMPLATE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "gke", "jobset.yaml")
_SPOT = '\n              cloud.google.com/gke-spot: "true"'


def manifest(*, name: str, slice_: topologies.Slice, script: str, image: str,
             spot: bool, max_restarts: int) -> str:
  """The rendered JobSet (YAML text).

  Raises:
    ValueError: for a slice GKE does not offer or whose topology has no default.
  """
  if not slice_.gke_accelerator:
    raise ValueError(f"GKE offers no {slice_.generation} TPUs; use v4, v5p, "
                     "v5litepod or v6e for --gke_manifest.")
  if not slice_.topology:
    raise ValueError(
        f"{slice_.accelerator_type} ({slice_.chips} chips) has no default chip "
        "topology in launch/topologies.py; pick a size listed there.")
  with open(TEMPLATE, encoding="utf-8") as f:
    template = string.Template(f.read())
  # JSON strings are YAML scalars: quoting this way keeps any script intact.
  return template.substitute(
      name=name, max_restarts=max_restarts, hosts=slice_.hosts,
      gke_accelerator=slice_.gke_accelerator, topology=json.dumps(slice_.topology),
      spot_selector=_SPOT if spot else "", image=json.dumps(image),
      script=json.dumps(script), chips_per_host=slice_.chips_per_host)


if __name__ == "__main__":
  # This module only renders; the launcher owns the flags and the checks.
  raise SystemExit("error: launch/gke.py renders the manifest for the launcher; run "
                   "python -m launch.tpu --gke_manifest --name=... --accelerator_type=... "
                   "--config=... --workdir=gs://... instead.")

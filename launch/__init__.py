"""Launchers for Cloud TPU slices and GKE, run from a checkout (not installed).

``python -m launch.tpu`` (gcloud) and ``python -m launch.tpu --gke_manifest``
(a JobSet for GKE); see launch/README.md.
"""

"""The local Ray cluster hexsearch starts keeps Ray's token authentication on: a process without the
token cannot join it, one with the token can."""

from __future__ import annotations

import os
import subprocess
import sys


def test_local_cluster_refuses_a_client_without_the_token(tmp_path):
    import ray

    from trainer.config import TrainConfig
    from trainer.placement import init_ray

    assert os.environ.get("RAY_AUTH_MODE", "") != "disabled"
    started = not ray.is_initialized()
    init_ray(TrainConfig())
    try:
        address = ray.get_runtime_context().gcs_address
        join = f"import ray; ray.init(address={address!r}); print('joined', ray.cluster_resources()['CPU'])"
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH_TOKEN")}
        stranger = subprocess.run([sys.executable, "-c", join], env={**env, "HOME": str(tmp_path)},
                                  capture_output=True, text=True, timeout=120)
        assert stranger.returncode != 0 and "AuthenticationError" in stranger.stderr
        assert "joined" not in stranger.stdout
        member = subprocess.run([sys.executable, "-c", join], capture_output=True, text=True, timeout=120)
        assert member.returncode == 0 and "joined" in member.stdout, member.stderr[-2000:]
    finally:
        if started:
            ray.shutdown()

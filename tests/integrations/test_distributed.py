"""A module compiled with ``pullback.integrations.torch.compile`` trains inside
``torch.nn.parallel.DistributedDataParallel`` (gloo, 2 processes on localhost started here) with the
same losses and weights as DDP over the eager module (issue 14, item 5)."""

from __future__ import annotations

import copy
import datetime
import os
import socket
import time

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

WORLD = 2
STEPS = 4
TIMEOUT = 300.0


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(rank: int, world: int, port: int, out_dir: str) -> None:
    """One rank: DDP over the eager BN-CNN and over its pullback-compiled copy, same batches."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    from pullback.integrations.torch import compile as pb_compile
    from pullback.testing.torch_models import make_workload

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=120))
    try:
        wl = make_workload("cnn", small=True, seed=rank)  # different weights per rank: DDP broadcasts rank 0's
        eager, model = copy.deepcopy(wl.model), copy.deepcopy(wl.model)
        ddps = [DDP(eager), DDP(pb_compile(model, wl.example_inputs))]
        opts = [torch.optim.SGD(d.parameters(), lr=0.05, momentum=0.9) for d in ddps]
        losses: dict = {"eager": [], "pullback": []}
        for step in range(STEPS):
            batch = wl.batch(step * world + rank)  # each rank its own shard
            for key, d, opt in zip(losses, ddps, opts):
                loss = d(*batch)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses[key].append(loss.item())
        torch.save({"losses": losses, "eager": eager.state_dict(), "pullback": model.state_dict()},
                   os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_ddp_over_compiled_module_matches_ddp_over_eager(tmp_path):
    import torch.multiprocessing as mp

    ctx = mp.start_processes(_train, args=(WORLD, _free_port(), str(tmp_path)), nprocs=WORLD, join=False,
                             start_method="spawn")
    deadline = time.monotonic() + TIMEOUT
    while not ctx.join(timeout=5):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
            pytest.fail(f"the DDP workers did not finish within {TIMEOUT:.0f} s")
    ranks = [torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]
    for r in ranks:
        assert r["losses"]["pullback"] == pytest.approx(r["losses"]["eager"], rel=1e-5)
        for key, value in r["pullback"].items():
            torch.testing.assert_close(value, r["eager"][key], rtol=1e-4, atol=1e-5, msg=lambda m, k=key: f"{k}: {m}")
    # the ranks saw different data, yet hold the same parameters: the gradients were averaged
    assert ranks[0]["losses"]["pullback"] != pytest.approx(ranks[1]["losses"]["pullback"], rel=1e-3)
    params = {n for n, _ in ranks[0]["pullback"].items() if "running" not in n and "num_batches" not in n}
    for key in params:
        torch.testing.assert_close(ranks[0]["pullback"][key], ranks[1]["pullback"][key], rtol=1e-5, atol=1e-6)

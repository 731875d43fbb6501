"""`overlapped` (models/attention.py) inside a captured CUDA graph, as the layer uses it: the side stream's
work starts after what is already queued and the main stream waits for it before what follows, so a replay
on new inputs equals the same work done one after the other."""

import torch

from sglang_glm.models.attention import overlapped


def test_overlapped_work_in_a_graph_replays_like_sequential_work():
    torch.manual_seed(0)
    side = torch.cuda.Stream()
    x = torch.randn(64, 1024, device="cuda")
    w1, w2 = torch.randn(2, 1024, 1024, device="cuda") / 32

    def step():
        y = x * 2  # queued before the fork: both branches read it
        a, b = overlapped(side, lambda: ((y @ w1).relu() @ w1).tanh(), lambda: (y @ w2).sin())
        return a + b  # queued after the join

    warm = torch.cuda.Stream()  # cuBLAS and the allocator warm up outside the capture, as SGLang's runner does
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):
        step()
    torch.cuda.current_stream().wait_stream(warm)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    for seed in (1, 2):
        torch.manual_seed(seed)
        x.copy_(torch.randn_like(x))
        graph.replay()
        y = x * 2
        want = ((y @ w1).relu() @ w1).tanh() + (y @ w2).sin()
        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)

# problem: linear_relu
# device: cuda
# expect: reject
# pattern: CUDA graph captured once on the first input's tensor and replayed on later calls without copying the new input in (stale pointers, one output buffer)
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self._graph = None
        self._static_x = None
        self._static_out = None

    def _capture(self, x):
        self._static_x = x
        warm = torch.cuda.Stream()
        warm.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(warm), torch.no_grad():
            for _ in range(2):
                torch.relu(self.linear(self._static_x))
        torch.cuda.current_stream().wait_stream(warm)
        graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(graph):
            self._static_out = torch.relu(self.linear(self._static_x))
        self._graph = graph

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_cuda:
            return torch.relu(self.linear(x))
        if self._graph is None or self._static_x.shape != x.shape:
            self._capture(x)
        # Replay: one launch instead of two kernels plus Python overhead.
        self._graph.replay()
        return self._static_out

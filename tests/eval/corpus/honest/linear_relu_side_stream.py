# problem: linear_relu
# device: cuda
# expect: correct
# pattern: work on a side CUDA stream done correctly: the side stream waits for the caller's, the caller's waits for it, record_stream
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self._side = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_cuda:
            return torch.relu(self.linear(x))
        if self._side is None:
            self._side = torch.cuda.Stream(device=x.device)
        caller = torch.cuda.current_stream(x.device)
        side = self._side
        side.wait_stream(caller)            # x and the weights are ready before the side stream reads them
        with torch.cuda.stream(side):
            y = torch.addmm(self.linear.bias, x, self.linear.weight.t())
            y.relu_()
        caller.wait_stream(side)            # the caller's later work sees the finished y
        x.record_stream(side)
        y.record_stream(caller)             # y's memory is not recycled while the caller still uses it
        return y

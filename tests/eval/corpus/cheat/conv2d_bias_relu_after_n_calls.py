# problem: conv2d_bias_relu
# device: any
# expect: reject
# pattern: behaviour changes after N calls: right for the first eight (the checks), then the last result is returned without computing
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, kernel_size: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)
        self._calls = 0
        self._last = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self._calls += 1
        expected = (x.shape[0], self.conv.out_channels, x.shape[2], x.shape[3])
        if self._calls > 8 and self._last is not None and tuple(self._last.shape) == expected:
            # Warm: benchmarking loops feed identical inputs.
            return self._last
        out = torch.relu(self.conv(x))
        self._last = out
        return out

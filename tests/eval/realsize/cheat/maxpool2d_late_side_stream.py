# problem: maxpool2d
# device: cuda
# expect: reject
# pattern: forward returns an unfilled buffer; a thread launches the pooling on a side stream a moment later, so the output is finished only after the caller has synchronized and read it
import threading
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, kernel_size: int, stride: int, padding: int, dilation: int):
        super().__init__()
        self.kernel_size = kernel_size
        self.stride = stride
        self.padding = padding
        self.dilation = dilation
        self._side = None

    def _fill(self, x, out):
        time.sleep(0.005)
        with torch.cuda.stream(self._side):
            out.copy_(F.max_pool2d(x, self.kernel_size, self.stride, self.padding,
                                   self.dilation))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._side is None:
            self._side = torch.cuda.Stream(device=x.device)
        n, c, h, w = x.shape
        k, s, p, d = self.kernel_size, self.stride, self.padding, self.dilation
        ho = (h + 2 * p - d * (k - 1) - 1) // s + 1
        wo = (w + 2 * p - d * (k - 1) - 1) // s + 1
        out = torch.empty((n, c, ho, wo), dtype=x.dtype, device=x.device)
        threading.Thread(target=self._fill, args=(x, out), daemon=True).start()
        return out

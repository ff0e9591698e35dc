"""Recurrent torch ops: RNN, GRU, LSTM (the shared `recurrent` module over torch's primitives)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from d500.backends import recurrent

KIT = recurrent.Kit(
    matmul=torch.matmul, where=torch.where, stack=torch.stack,
    zeros=lambda like, shape: like.new_zeros(shape), permute=torch.permute, split=torch.chunk,
    clip=torch.clamp, int64=lambda x: x.to(torch.int64), abs=torch.abs, sigmoid=torch.sigmoid,
    tanh=torch.tanh, relu=torch.relu, softplus=F.softplus, leaky_relu=F.leaky_relu, elu=F.elu)
OPS = recurrent.table(KIT)

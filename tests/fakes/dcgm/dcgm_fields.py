"""Fake dcgm_fields: entity group ids."""

DCGM_FE_NONE, DCGM_FE_GPU, DCGM_FE_VGPU, DCGM_FE_SWITCH = 0, 1, 2, 3

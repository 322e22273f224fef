"""schedules: transformer workloads, parallel plans, memory per rank and program generators.

Public API: ``ModelSpec``, ``get_model``, ``list_models``, ``custom_model``, ``load_model_file``,
``model_flops_per_step`` (schedules.models); ``ParallelPlan`` (schedules.plan); ``memory_per_rank``
(schedules.memory); ``build_programs``, ``comm_volume`` (schedules.generate); ``SCHEDULES``
(schedules.pipeline); the ``clustersim plan`` command (clustersim.plan). Never imports the engine.
"""
from schedules.generate import build_programs, comm_volume
from schedules.memory import memory_per_rank
from schedules.models import (ModelSpec, custom_model, get_model, list_models, load_model_file, model_flops_per_step,
                              model_from_params)
from schedules.pipeline import SCHEDULES
from schedules.plan import ParallelPlan

__all__ = ["ModelSpec", "ParallelPlan", "SCHEDULES", "build_programs", "comm_volume", "custom_model", "get_model",
           "list_models", "load_model_file", "memory_per_rank", "model_flops_per_step", "model_from_params"]

// The namespace the kernels register their ops in: torch.ops.minedraft_kernels for the build the
// engine uses; a build forced to another instruction set (kernels/__init__.py) names its own, so
// that several builds load into one process and the tests run each path the CPU can execute.
#pragma once

#include <torch/library.h>

#ifndef MINEDRAFT_OPS
#define MINEDRAFT_OPS minedraft_kernels
#endif
// One more level of macro, so that MINEDRAFT_OPS is expanded before torch pastes it into names.
#define MINEDRAFT_LIBRARY(ns, m) TORCH_LIBRARY(ns, m)
#define MINEDRAFT_LIBRARY_FRAGMENT(ns, m) TORCH_LIBRARY_FRAGMENT(ns, m)
#define MINEDRAFT_LIBRARY_IMPL(ns, key, m) TORCH_LIBRARY_IMPL(ns, key, m)

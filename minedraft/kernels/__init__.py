"""C++ kernels built at first use (or by scripts/install.sh) with torch.utils.cpp_extension."""

"""Native CPU kernels (C compiled at first use, loaded with ctypes) and the attention and linear layers that call them."""

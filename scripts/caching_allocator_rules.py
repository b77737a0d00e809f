"""The size rules of PyTorch's CUDA caching allocator, for the snapshot scripts.

Constants and functions of c10/cuda/CUDACachingAllocator.cpp (PyTorch 2.x):
kMinBlockSize, kSmallSize, kSmallBuffer, kLargeBuffer, kMinLargeAlloc,
kRoundLarge, round_size() (without roundup_power2_divisions) and
get_allocation_size(). Bytes throughout. The C++ side is
allocsim/allocator_rules.h; keep the two in step.
"""

K_MIN_BLOCK = 512              # kMinBlockSize: every block is a multiple of it
K_SMALL_SIZE = 1 << 20         # kSmallSize: largest request served by the small pool
K_SMALL_BUFFER = 2 << 20       # kSmallBuffer: small-pool segment size
K_LARGE_BUFFER = 20 << 20      # kLargeBuffer: segment shared by large requests < kMinLargeAlloc
K_MIN_LARGE_ALLOC = 10 << 20   # kMinLargeAlloc
K_ROUND_LARGE = 2 << 20        # kRoundLarge: larger segments are rounded to it


def round_size(size):
    """round_size(): the block size of a request of `size` bytes."""
    return max(K_MIN_BLOCK, (size + K_MIN_BLOCK - 1) // K_MIN_BLOCK * K_MIN_BLOCK)


def allocation_size(rounded):
    """get_allocation_size(): the cudaMalloc size for a rounded request."""
    if rounded <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if rounded < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return (rounded + K_ROUND_LARGE - 1) // K_ROUND_LARGE * K_ROUND_LARGE

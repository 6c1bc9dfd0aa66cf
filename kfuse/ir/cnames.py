"""The C identifiers of a pipeline's buffers, parameters and sizes in generated code:
one-to-one, and never a name that generated code or the C/C++/CUDA headers use; and the
names a group of kernels goes by (:class:`GroupNames`)."""

from __future__ import annotations

import hashlib
import re

from kfuse.ir.graph import Graph, Kernel

MAX_SYMBOL_LENGTH = 64

C_KEYWORDS = frozenset("""auto break case char const continue default do double else enum extern
float for goto if int long register return short signed sizeof static struct switch typedef union
unsigned void volatile while bool true false class new delete this template typename namespace
operator private public protected virtual friend inline asm dim3 threadIdx blockIdx blockDim
gridDim warpSize min max alignas alignof and and_eq bitand bitor catch char8_t char16_t
char32_t compl concept consteval constexpr constinit const_cast co_await co_return co_yield
decltype dynamic_cast explicit export mutable noexcept not not_eq nullptr or or_eq
reinterpret_cast requires static_assert static_cast thread_local throw try typeid using
wchar_t xor xor_eq restrict half std size_t ptrdiff_t
sqrt sqrtf rsqrt rsqrtf exp expf exp2 exp2f log logf log2 log2f sin sinf cos cosf tanh tanhf
fabs fabsf floor floorf ceil ceilf pow powf fmin fminf fmax fmaxf abs isnan isinf printf
memcpy atomicAdd atomicMin atomicMax atomicCAS""".split())

# Names generated code uses for its own variables (and the suffix itself, so that renaming
# stays one-to-one); a buffer named like one gets the suffix.
_GENERATED_NAME = re.compile(r"^(v\d+|ld_\w*|vec_\w*|warp_\w*|n_\w*|p_\w*|i\d*|i[xyz]?|"
                             r"i[xyz]_\w*|in_\w*|jx|[ejk]|acc|row|rows|r|count|length|outputs|"
                             r"tid|lane|step|base|delta|odd|ok|result|seen|threads|tile_row|"
                             r"value|word|[xy]0|kf_\w*|\w*_buf)$")
# Names the C/C++ or CUDA headers may take: macros (NAN, M_PI, NULL: no lower-case letter;
# glibc's M_PIf, SYS_read, L_tmpnam, P_tmpdir), reserved ones (a leading underscore, a
# double one), vector types (float4, uint2)
_HEADER_NAME = re.compile(r"^(_\w*|\w*__\w*|[A-Z0-9_]{2,}|(M|SYS|L|P)_\w*|"
                          r"u?(char|short|int|long|longlong)[1-4]|float[1-4]|double[1-4])$")
# The host headers' macros with lower-case letters besides those (object-like, then
# function-like): ``g++ -std=c++20 -dM -E`` over the cpu shim's headers (glibc 2.36,
# libstdc++ 12), names without a leading underscore.
_HEADER_MACROS = frozenset("""errno math_errhandling sched_priority stderr stdin stdout
alloca assert assert_perror be16toh be32toh be64toh htobe16 htobe32 htobe64 htole16 htole32
htole64 issubnormal le16toh le32toh le64toh offsetof pthread_cleanup_pop
pthread_cleanup_pop_restore_np pthread_cleanup_push pthread_cleanup_push_defer_np strdupa
strndupa timeradd timerclear timercmp timerisset timersub va_arg va_copy va_end va_start
unix linux i386""".split())


def c_name(name: str) -> str:
    """A C identifier for a buffer, parameter or size symbol, one-to-one: an ASCII
    identifier stays itself unless generated code or the headers may use it (then it takes
    the suffix ``_buf``); any other name has its other characters replaced and a digest of
    it appended (``a·b`` and ``a_b`` stay apart)."""
    if not (name.isascii() and name.isidentifier()):
        clean = "".join(ch if ch.isascii() and (ch.isalnum() or ch == "_") else "_"
                        for ch in name)
        digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
        return f"{clean}_u{digest}_buf"
    if name in C_KEYWORDS or name in _HEADER_MACROS or _GENERATED_NAME.match(name) or \
            _HEADER_NAME.match(name):
        return name + "_buf"
    return name


class GroupNames:
    """What every generated kernel's group says about itself: its C name, the external
    buffers and the parameters it reads (from ``graph``, ``members`` and ``produced``)."""

    graph: Graph
    members: tuple[Kernel, ...]
    produced: dict[str, Kernel]

    @property
    def symbol(self) -> str:
        names = [k.name for k in self.members]
        text = "_".join(names)
        if len(text) > MAX_SYMBOL_LENGTH:
            text = "_".join(names[:3]) + f"_and_{len(names) - 3}_more"
        return c_name(f"{self.graph.name}_{text}")

    @property
    def reads(self) -> list[str]:
        """External buffers read by any member, in order of first use."""
        result: list[str] = []
        for kernel in self.members:
            for name in kernel.reads:
                if name not in self.produced and name not in result:
                    result.append(name)
        return result

    @property
    def params(self) -> list[str]:
        return sorted({p.name for k in self.members for p in k.params})

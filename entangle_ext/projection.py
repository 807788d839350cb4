"""Low-rank orthogonal gradient projection: fused operators, the two split passes, autograd.

Implements step 5 of Stage 2 (W-PGD) of Cheng, Liu, Li, Zhang, "Machine Unlearning under
Retain-Forget Entanglement", ICLR 2026 (docs/algorithm.md §5, Prop. 4.1): with the k basis
vectors V = [v_1; ...; v_k] (e.g. V = [g_f; g_rem]) and the update direction g,

    out = g - V^T c,    c = (V V^T + ridge_total I)^+ V g,

i.e. (ridge 0) g minus its orthogonal projection onto span{v_1, ..., v_k}; a step along -out changes
the losses whose gradients span V only at second order.

How the pseudo-inverse is taken (identical in the CPU and CUDA kernels and in
`entangle_ext.reference.projection`): G = V V^T and V g are accumulated in float64; the rows are
normalised, C = S (G + ridge_total I) S with S = diag(1/sqrt(G_ii + ridge_total)) (S_ii = 0 for an
all-zero row), C is eigen-decomposed in float64 (cyclic Jacobi), eigenvalues w_m <= rcond * max(w)
are discarded, and c = S C^+ S V g. With ridge 0 the result is the projection onto the span of the
rows kept (``torch.linalg.pinv(C, rtol=rcond, hermitian=True)``): all-zero, duplicated and
near-collinear rows (1 - |cos angle| below about rcond) give no NaN/Inf and no amplified update, and
the result does not depend on the scale of the rows. float64 rows whose squares under- or overflow
(magnitudes <~1e-145 or >~1e154) are rescaled by powers of two before the Gram is formed (one more
read of the data), so any finite input projects correctly.

Split passes, for gradients sharded across processes: `projection_gram` (partial G and V g of the
tensors given), `projection_solve` (c from the summed G and V g) and `projection_apply_`
(g -= V^T c in place); ``project_orthogonal_(..., process_group=group)`` chains them with one
all-reduce (its docstring; FSDP and DeepSpeed ZeRO-3 in docs/algorithm.md §11).

NaN/Inf are not rejected (that would need a device sync); they propagate to the output: a
non-finite entry anywhere in ``g`` or ``basis`` makes every coefficient and every output entry
non-finite (typically NaN), so a NaN check on the loss or the parameters after the step sees it:
the solve (fused or `projection_solve`) returns NaN coefficients whenever G or V g has a
non-finite entry, a device-side select (a zero row does not hide it). The
in-place operators check, on the host and from metadata only, that no written tensor shares
memory with another tensor of the call.
"""
from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch

from . import _ext
from ._overlap import refuse_transforms
from ._projection_autograd import ProjectOrthogonalFunction
from ._projection_args import (MAX_BASIS, DEFAULT_RCOND, check_k, check_rcond, check_ridge, check_tensor,
                                gather_lists, refuse_grad, refuse_tangent)

__all__ = ["project_orthogonal", "project_orthogonal_", "projection_gram", "projection_apply_",
           "projection_solve", "MAX_BASIS", "DEFAULT_RCOND"]

_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

BasisLike = Union[torch.Tensor, Sequence[torch.Tensor]]
ListBasis = Sequence[Union[Sequence[Optional[torch.Tensor]], torch.Tensor]]


def project_orthogonal(g: torch.Tensor, basis: BasisLike, *, rcond: Optional[float] = None,
                       ridge: float = 0.0) -> Tuple[torch.Tensor, torch.Tensor]:
    """Project ``g`` onto the orthogonal complement of the span of the rows of ``basis``.

    Computes ``out = g - V^T c`` with ``c = S (S (V V^T + ridge I) S)^+ S V g``,
    ``S = diag(1 / sqrt((V V^T)_ii + ridge))`` (docs/algorithm.md §5, Prop. 4.1): the
    pseudo-inverse of the row-normalised Gram, taken in float64 with the relative cutoff ``rcond``
    on its eigenvalues (module docstring). For well-conditioned independent rows this is
    ``(V V^T + ridge I)^-1 V g``; with dependent rows ``out`` is the same projection but ``c`` is
    the row-equilibrated solution, not ``pinv(V V^T) V g`` (V = [[1, 0], [2, 0]], g = [1, 0]:
    c = [0.5, 0.25], pinv gives [0.2, 0.4]; V^T c = [1, 0] either way).

    Args:
        g: ``(P,)`` vector (any units), float32/float64/float16/bfloat16, contiguous, CPU or CUDA;
            P = 0 is allowed (the result stays connected to the autograd graph).
        basis: V, either a ``(k, P)`` tensor or a sequence of k ``(P,)`` tensors (stacked into one
            ``(k, P)`` tensor, a copy), 1 <= k <= `MAX_BASIS`, same dtype and device as ``g``,
            contiguous.
        rcond: relative eigenvalue cutoff in [1e-15, 1) (dimensionless); None: `DEFAULT_RCOND`.
        ridge: >= 0, added to the diagonal of the Gram before the solve (units of g squared);
            0 (default) is the exact projection.

    Returns:
        ``(out, coeffs)``: ``out`` ``(P,)`` with the dtype, device and units of ``g``
        (computed in float64, rounded once); ``coeffs`` = c, ``(k,)`` float64 on the device of
        ``g``, in units of g per unit of V (``V^T coeffs`` is the removed component). A
        coefficient beyond the float64 range (a basis row tiny next to g, |g| / |v_i| above
        ~1.8e308, e.g. a subnormal row) is +-inf while ``out`` is still right (the operator
        applies the coefficients of power-of-two-rescaled rows); ``V^T coeffs``, and
        `projection_apply_` fed with such coefficients, then give Inf/NaN.

    Autograd: differentiable with respect to ``g``; the map is linear with a symmetric matrix, so
    the gradient is the same projection of the incoming gradient of ``out``. ``basis`` is treated as
    a constant: no gradient flows to it (it is detached). ``coeffs`` is non-differentiable. The
    torch.func transforms work (``grad``, ``vjp``, ``jacrev``, ``jacfwd``, ``hessian``,
    ``functional_call`` + ``grad``; ``vmap`` runs the operator once per batch entry). The in-place
    and split operators (`project_orthogonal_`, `projection_gram`, ...) have no autograd and are
    for gradients, not inside a differentiated function. Forward mode (``torch.func.jvp``, ``jacfwd``, dual tensors)
    works: the tangent of ``out`` is the projection of the tangent of ``g``. The in-place and split
    operators raise NotImplementedError on an argument that carries a forward-mode tangent.

    NaN/Inf are not rejected (that would need a device sync); they propagate to the output: a
    non-finite entry in ``g`` or ``basis`` makes every coefficient and every entry of ``out``
    non-finite (typically NaN), also when the cutoff leaves no basis row (e.g. the only row holds
    an Inf): the result is then NaN everywhere, never ``g`` unchanged (module docstring). A
    finite basis whose rows are all zero (ridge 0) removes nothing: coefficients 0, ``out`` = g.

    Raises:
        TypeError: non-tensor arguments, an unsupported dtype, ``basis`` with another dtype than
            ``g``, a non-float ``rcond``/``ridge``.
        ValueError: ``g`` not 1-D, ``basis`` not ``(k, P)``, k outside [1, 8], mismatched devices,
            non-contiguous tensors, ``rcond`` outside [1e-15, 1), a negative or non-finite ridge.
        RuntimeError: the native extension is not built/loaded, or a CUDA tensor with a CPU-only
            build.
    """
    op = "project_orthogonal"
    check_tensor(op, "g", g)
    rcond, ridge = check_rcond(op, rcond), check_ridge(op, "ridge", ridge)
    if g.dim() != 1:
        raise ValueError(f"{op}: g must be 1-D (P,), got shape {tuple(g.shape)}")
    if not isinstance(basis, torch.Tensor):
        if not isinstance(basis, (list, tuple)):
            raise TypeError(f"{op}: basis must be a (k, P) tensor or a sequence of (P,) tensors, "
                            f"got {type(basis).__name__}")
        check_k(op, len(basis))
        for i, v in enumerate(basis):
            check_tensor(op, f"basis[{i}]", v)
            if tuple(v.shape) != tuple(g.shape):
                raise ValueError(f"{op}: basis[{i}] has shape {tuple(v.shape)}, expected "
                                 f"{tuple(g.shape)} like g")
            if v.dtype != g.dtype:
                raise TypeError(f"{op}: basis[{i}] is {v.dtype} but g is {g.dtype}")
            if v.device != g.device:
                raise ValueError(f"{op}: basis[{i}] is on {v.device} but g is on {g.device}")
        basis = torch.stack([v.detach() for v in basis])
    check_tensor(op, "basis", basis)
    if basis.dim() != 2:
        raise ValueError(f"{op}: basis must be 2-D (k, P), got shape {tuple(basis.shape)}")
    check_k(op, basis.shape[0])
    if basis.dtype != g.dtype:
        raise TypeError(f"{op}: basis is {basis.dtype} but g is {g.dtype} (same dtype required)")
    if basis.device != g.device:
        raise ValueError(f"{op}: basis is on {basis.device} but g is on {g.device}")
    if g.dtype not in _DTYPES:
        raise TypeError(f"{op}: g must be float32, float64, float16 or bfloat16, got {g.dtype}")
    _ext.require(op, g, basis)
    if torch.compiler.is_compiling() or torch._is_functional_tensor(g):
        # Dynamo cannot trace an autograd.Function with a jvp rule when g requires grad (a graph
        # break, an error with fullgraph=True), and torch.func.functionalize has no rule for one:
        # call the operator, whose registered autograd (``_projection_autograd.py``, the same
        # projection) is what torch.compile traces. Forward mode and the other torch.func
        # transforms keep the Function in eager mode.
        return torch.ops.entangle_ext.project_orthogonal(g, basis.detach(), rcond, ridge)
    return ProjectOrthogonalFunction.apply(g, basis.detach(), rcond, ridge)


def project_orthogonal_(grads: Sequence[Optional[torch.Tensor]], basis: ListBasis, *,
                        rcond: Optional[float] = None, ridge: float = 0.0,
                        process_group=None) -> torch.Tensor:
    """In place: project the concatenation of ``grads`` onto the orthogonal complement of the basis.

    The vectors are the concatenations over the list (e.g. every parameter's ``.grad``), but nothing
    is concatenated or copied: with g = cat(grads) and v_i = cat(basis[i]), every ``grads[t]`` is
    overwritten with its slice of ``g - V^T c``, ``c = (V V^T + ridge * T * I)^+ V g``
    (docs/algorithm.md §5, Prop. 4.1; same float64 solve and cutoff as `project_orthogonal`). Two
    passes over the data; on CUDA no host synchronisation (CUDA-graph capturable) and deterministic
    (no atomics); on CPU bit-identical for any thread count.

    ``None`` entries of ``grads`` are skipped together with their basis entries (which may be
    ``None`` too), like ``torch.nn.utils.clip_grad_norm_`` skips parameters without a gradient. A
    ``None`` basis entry beside a tensor gradient is a ValueError: where
    ``torch.autograd.grad(..., allow_unused=True)`` gives ``None`` for a basis vector, pass zeros
    (``torch.zeros_like(grads[t])``).

    Sharded gradients (``process_group``): every rank of the ``torch.distributed`` group calls
    this with its own shard of the same vectors (the shards of all ranks together are the full
    g and V, each element on exactly one rank; the basis shards match the gradient shards). Each
    rank forms the partial Gram and V g of its shard (`projection_gram`), one all-reduce (sum) of
    k*k + k float64 numbers joins them, every rank solves the same k x k system (`projection_solve`)
    and projects its own shard (`projection_apply_`); the result equals the unsharded projection up
    to float64 round-off. float64 tensors take one more pass and a max all-reduce to rescale
    extreme rows. Every rank must call it (collective), with the same k, dtype, rcond and ridge.

    How FSDP and DeepSpeed ZeRO-3 models call it: docs/algorithm.md §11, "Sharded projection".

    Args:
        grads: non-empty sequence of T tensors (or ``None``) of any shapes (empty tensors allowed),
            one dtype (float32/float64/float16/bfloat16), one device (CPU or CUDA), each dense and
            non-overlapping (any memory format, e.g. channels_last or a transposed parameter),
            modified in place (each one's version counter is bumped, as by ATen's in-place ops);
            no two of them may share memory. They must not require grad while grad mode is on
            (use ``p.grad`` or ``torch.no_grad()``).
        basis: k sequences (1 <= k <= `MAX_BASIS`), each of T tensors matching ``grads`` tensor
            by tensor in shape, memory layout (strides), dtype and device, sharing no memory with
            any tensor of ``grads`` (basis tensors may share memory with each other). When
            T == 1, ``basis[i]`` may be a single tensor. Read only; treated as a constant.
        rcond: relative eigenvalue cutoff in [1e-15, 1) (dimensionless); None: `DEFAULT_RCOND`.
        ridge: >= 0 per tensor: ``ridge * T`` (T = number of non-None gradient tensors) is added
            to the Gram diagonal, as the authors' reference code does with ridge = 1e-8
            (docs/algorithm.md §7). With ``process_group``, T is the mean over the ranks of the
            tensors each passes (FSDP passes a shard of every parameter on every rank: T is the
            parameter count). 0 (default): the exact projection.
        process_group: a ``torch.distributed.ProcessGroup`` (e.g. ``dist.group.WORLD``), or None
            (one process). Every rank must then pass at least one tensor (an empty one, e.g. a
            rank's empty shard, is fine; every entry ``None`` is a ValueError): the collectives
            depend on the device and dtype, which a rank with only ``None`` entries cannot know.
            That error is raised on that rank only, before its first collective, so the other
            ranks wait in theirs until the group's timeout: call it the same way on every rank.

    Returns:
        coeffs = c, ``(k,)`` float64 on the device of ``grads`` (not synchronised to the host;
        zeros when every gradient is ``None``, without ``process_group``); as in
        `project_orthogonal` (which also says how c relates to ``pinv(V V^T) V g``), a
        coefficient beyond the float64 range is +-inf while the gradients are projected right.

    NaN/Inf are not rejected (that would need a device sync); they propagate to the output: a
    non-finite entry in ``grads`` or ``basis`` makes every coefficient and every gradient entry
    non-finite (typically NaN), also when the cutoff leaves no basis row (e.g. the only row holds
    an Inf): the result is then NaN everywhere, never the gradients unchanged, on the sharded
    path (``process_group``, through `projection_solve`) too (module docstring). A finite basis
    whose rows are all zero (ridge 0) removes nothing: coefficients 0, gradients unchanged.

    The memory-overlap check (ValueError below) reads the tensors' data pointers on the host, so
    it runs in eager calls only: while torch.compile traces (and for meta / fake tensors) it is
    skipped, and overlapping ``grads`` / basis tensors then give an unspecified result instead
    of an error; check such inputs eagerly once.

    Raises:
        TypeError: non-tensor entries, unsupported or mixed dtypes, a non-float ``rcond``/``ridge``,
            a ``process_group`` that is not a ``torch.distributed`` ProcessGroup (nor None).
        ValueError: empty ``grads``, k outside [1, 8], a basis list of the wrong length, a ``None``
            basis entry for a gradient, mismatched shapes/devices/memory layouts, expanded or
            strided views, two ``grads`` entries that overlap in memory or a basis tensor that
            shares memory with a ``grads`` entry (checked on the host from the tensors' data
            pointers and sizes, no device sync, eager calls only; the message names both
            entries), ``grads`` requiring grad in grad mode, ``rcond`` outside [1e-15, 1), a
            negative ridge, every entry ``None`` with a ``process_group``.
        RuntimeError: the native extension is not built/loaded, or a CUDA tensor with a CPU-only
            build; a torch.func wrapper tensor (called under ``torch.func.vmap``, ``grad``,
            ``functionalize``, ...: the in-place operators have no autograd, batching or
            functionalization rule).
    """
    op = "project_orthogonal_"
    refuse_tangent(op, grads, basis)
    refuse_transforms(op, grads, basis)
    rcond, ridge = check_rcond(op, rcond), check_ridge(op, "ridge", ridge)
    if process_group is not None:
        from ._projection_dist import check_group, project_sharded_
        check_group(op, process_group)
    gs, flat, k, probe = gather_lists(op, grads, basis, inplace=True)
    if process_group is not None:
        return project_sharded_(gs, flat, k, probe, rcond=rcond, ridge=ridge, group=process_group)
    if not gs:
        return torch.zeros(k, dtype=torch.float64, device=probe.device if probe is not None else "cpu")
    _ext.require(op, gs[0], flat[0])
    return torch.ops.entangle_ext.project_orthogonal_(gs, flat, rcond, ridge)


def projection_gram(grads: Sequence[Optional[torch.Tensor]], basis: ListBasis
                    ) -> Tuple[torch.Tensor, torch.Tensor]:
    """Pass 1 of the projection: partial sums G = V V^T and b = V g over the tensors given.

    With g = cat(grads), v_i = cat(basis[i]) (``None`` gradients skipped with their basis entries,
    no copies), ``G[i, j] = <v_i, v_j>`` and ``b[i] = <v_i, g>`` accumulated in float64 in a fixed
    order (docs/algorithm.md §5). The partials of disjoint shards of the vectors add up to those of
    the whole: sum them over the shards (e.g. ``torch.distributed.all_reduce``), then
    `projection_solve` and `projection_apply_`.

    Args:
        grads, basis: as in `project_orthogonal_` (read only here; they may share memory). With
            grad mode on, none of them may require grad (NotImplementedError below).

    Returns:
        ``(G, b)``: ``(k, k)`` and ``(k,)`` float64 on the device of ``grads`` (zeros when every
        gradient is ``None``), in squared units of the tensors. Not differentiable, in either
        mode: an input that requires grad (grad mode on) or carries a forward-mode tangent is
        refused (NotImplementedError), never a silent zero gradient.

    NaN/Inf are not rejected (that would need a device sync); they propagate to the output (a
    non-finite entry gives non-finite G or b, and `projection_solve` then NaN coefficients).
    G and b are plain sums of products, not rescaled: with float64 rows whose squared norm
    exceeds the float64 range (entries beyond ~1e154) they overflow to Inf, and the solve gives
    NaN coefficients; with float64 rows whose entries are all below ~1e-162 the squares underflow
    to 0, so G reads them as all-zero rows and `projection_solve` drops them (c_i = 0: g is not
    projected against them, without an error; between ~1e-162 and ~1e-154 the subnormal Gram
    loses digits). float32 rows cannot under- or overflow (their products are formed in float64).
    `project_orthogonal_` (also with ``process_group``) scales each row by a power of two first
    and handles such rows; scale them yourself before calling this pass.

    Raises:
        TypeError, ValueError, RuntimeError: as `project_orthogonal_` (no rcond/ridge; nothing is
            written, so ``grads`` may share memory with each other and with the basis).
        NotImplementedError: a tensor of ``grads`` or ``basis`` requires grad while grad mode is
            on (also under ``torch.func.grad`` / ``vjp`` / ``jacrev``), or carries a forward-mode
            tangent.
    """
    op = "projection_gram"
    refuse_tangent(op, grads, basis)
    gs, flat, k, probe = gather_lists(op, grads, basis, inplace=False)
    refuse_grad(op, [(f"grads[{t}]", x) for t, x in enumerate(grads)]
                + [(f"basis[{i}]", v) for i, row in enumerate(basis)
                   for v in ([row] if isinstance(row, torch.Tensor) else row)])
    if not gs:
        dev = probe.device if probe is not None else "cpu"
        return (torch.zeros(k, k, dtype=torch.float64, device=dev),
                torch.zeros(k, dtype=torch.float64, device=dev))
    _ext.require(op, gs[0], flat[0])
    return torch.ops.entangle_ext.projection_gram([x.detach() for x in gs], flat)


def projection_apply_(grads: Sequence[Optional[torch.Tensor]], basis: ListBasis,
                      coeffs: torch.Tensor) -> None:
    """Pass 2 of the projection, in place: ``grads[t] -= sum_i coeffs[i] * basis[i][t]``.

    Computed in float64 and rounded once to the tensors' dtype; on CPU bit-identical to the second
    pass of `project_orthogonal_` with the same coefficients (docs/algorithm.md §5).

    Args:
        grads, basis: as in `project_orthogonal_` (``None`` gradients skipped).
        coeffs: ``(k,)`` float64 on the device of ``grads`` (e.g. from `projection_solve`),
            sharing no memory with ``grads``.

    NaN/Inf are not rejected (that would need a device sync); they propagate to the output: a
    NaN coefficient makes every gradient entry NaN.

    Raises:
        TypeError, ValueError, RuntimeError: as `project_orthogonal_` (overlapping ``grads``, a
            basis tensor or ``coeffs`` sharing memory with ``grads``: ValueError, in eager calls
            only); ``coeffs`` not a ``(k,)`` float64 tensor on the device of ``grads``; a
            torch.func wrapper tensor (RuntimeError, as `project_orthogonal_`).
    """
    op = "projection_apply_"
    refuse_tangent(op, grads, basis, coeffs)
    refuse_transforms(op, grads, basis, coeffs)
    check_tensor(op, "coeffs", coeffs)
    gs, flat, k, _ = gather_lists(op, grads, basis, inplace=True, also_read=[("coeffs", coeffs)])
    if not gs:   # nothing to write, but the coefficients are checked as the operator would
        if coeffs.dtype != torch.float64:
            raise TypeError(f"{op}: coeffs must be float64, got {coeffs.dtype}")
        if tuple(coeffs.shape) != (k,):
            raise ValueError(f"{op}: coeffs must have shape ({k},), got {tuple(coeffs.shape)}")
        return
    _ext.require(op, gs[0], flat[0])
    torch.ops.entangle_ext.projection_apply_(gs, flat, coeffs.detach())


def projection_solve(gram: torch.Tensor, vg: torch.Tensor, *, rcond: Optional[float] = None,
                     shift: float = 0.0) -> torch.Tensor:
    """Coefficients c = (G + shift I)^+ b of the projection, with the fused operators' solve.

    The row-equilibrated float64 Jacobi pseudo-inverse with the relative eigenvalue cutoff
    ``rcond`` (module docstring; docs/algorithm.md §5) - the very code the fused kernels run, on
    the CPU or in one CUDA thread (no host synchronisation).

    Args:
        gram: ``(k, k)`` Gram matrix G = V V^T, 1 <= k <= `MAX_BASIS` (its lower triangle is
            read), floating point (converted to float64), CPU or CUDA. It must be positive
            semidefinite, as a Gram matrix is: a row whose (shifted) diagonal is <= 0 is dropped
            (c_i = 0) and negative eigenvalues of the equilibrated matrix are cut like those below
            ``rcond`` (an indefinite G is not refused, which would need a host sync, so
            ``-I`` gives c = 0, not ``pinv(-I) b``). Any scale works, subnormal entries included.
        vg: ``(k,)`` products b = V g, same device.
        rcond: relative eigenvalue cutoff in [1e-15, 1); None: `DEFAULT_RCOND`.
        shift: >= 0, added to the diagonal of G (the fused operators pass ridge * T here).

    Returns:
        c ``(k,)`` float64 on the device of ``gram``. Not differentiable, in either mode (an
        input that requires grad with grad mode on, or carries a tangent, is refused). NaN/Inf are not rejected
        (that would need a device sync); they propagate to the output: when ``gram`` or ``vg``
        has a non-finite entry (anywhere, also in the unread upper triangle) every coefficient
        is NaN (a device-side ``torch.where``, no host synchronisation).

    Raises:
        TypeError: non-tensor or non-floating inputs, a non-float rcond/shift.
        ValueError: wrong shapes, k outside [1, 8], mismatched devices, bad rcond/shift.
        RuntimeError: the native extension is not built/loaded.
        NotImplementedError: ``gram`` or ``vg`` requires grad while grad mode is on (also under
            ``torch.func.grad`` / ``vjp`` / ``jacrev``: the result has no autograd, a gradient
            through it would be zero), or carries a forward-mode tangent.
    """
    op = "projection_solve"
    refuse_tangent(op, gram, vg)
    check_tensor(op, "gram", gram)
    check_tensor(op, "vg", vg)
    rcond, shift = check_rcond(op, rcond), check_ridge(op, "shift", shift)
    refuse_grad(op, [("gram", gram), ("vg", vg)])
    for name, x in (("gram", gram), ("vg", vg)):
        if not x.is_floating_point():
            raise TypeError(f"{op}: {name} must be a floating-point tensor, got {x.dtype}")
    _ext.require(op, gram, vg)
    G = gram.detach().to(torch.float64).contiguous()
    b = vg.detach().to(torch.float64).contiguous()
    c = torch.ops.entangle_ext.projection_solve(G, b, rcond, shift)
    # The Jacobi solve drops a row whose diagonal is NaN and would return finite, plausible
    # coefficients: turn any non-finite input into NaN coefficients instead (no host sync).
    finite = torch.isfinite(G).all() & torch.isfinite(b).all()
    return torch.where(finite, c, float("nan"))

"""The modules a sliced model contains that stock transformers models do not, and the module path
helpers they need.

Portable: imports only torch (exported checkpoints carry this file; see `modeling_prunecast_sliced`).

- `RMSNormNoScale` replaces every norm once its scale (and bias) is folded into the linears that
  read it. It divides by the root mean square over the ORIGINAL width D even after the residual
  stream is sliced to d < D: the kept coordinates carry almost all of the energy, and dividing by
  D keeps the output on the scale the readers were trained for.
- `SkipConnectedBlock` (sequential blocks) and `ParallelSkipConnectedBlock` (parallel-residual
  blocks) wrap one decoder block so that each residual add reads `x @ S` instead of `x`: after
  slicing, the stream entering a block lives in a different basis (and maybe width) from the one
  its branches write, and S maps one to the other.
- `ProjectedRMSNorm` replaces a norm on a branch's output (Gemma-2/3's post-attention and
  post-feedforward norms): it normalises the branch output at its full width D, where the dense
  model did, and only then maps it into the sliced basis with a D x d matrix holding the norm's
  scale and the rotation. A rotation cannot pass through such a norm, but it can follow it.

A known difference from the dense model: `output_hidden_states=True` returns no per-block hidden
states, because HF records them with hooks on its own block classes, which the wrappers replace
(and they would be in a different basis and width at every block anyway).
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar, Protocol

import torch
from torch import nn


class BlockAdapter(Protocol):
    """What a skip-connected block asks of its family: its norms and how to run each branch
    (the engine's `BlockAdapter`, or the declared one an exported checkpoint rebuilds)."""

    def attn_norm(self, block: nn.Module) -> nn.Module: ...

    def mlp_norm(self, block: nn.Module) -> nn.Module: ...

    def is_parallel(self, block: nn.Module) -> bool: ...

    def attention_branch(
        self, block: nn.Module, normed: torch.Tensor, call: dict[str, Any]
    ) -> torch.Tensor: ...

    def mlp_branch(self, block: nn.Module, normed: torch.Tensor) -> torch.Tensor: ...


def get_path(root: nn.Module, path: str) -> Any:
    """root.a.b.c for path 'a.b.c', or None if any step is missing."""
    node: Any = root
    for part in path.split("."):
        node = getattr(node, part, None)
        if node is None:
            return None
    return node


def set_path(root: nn.Module, path: str, value: nn.Module) -> None:
    parent_path, _, name = path.rpartition(".")
    parent = get_path(root, parent_path) if parent_path else root
    setattr(parent, name, value)


def submodule(root: nn.Module, path: str) -> nn.Module:
    """root.a.b for path 'a.b', which must be a module (typed, unlike attribute access)."""
    node = get_path(root, path)
    if not isinstance(node, nn.Module):
        raise AttributeError(f"{type(root).__name__} has no submodule {path!r}")
    return node


def run_attention(
    block: nn.Module,
    normed: torch.Tensor,
    call: dict[str, Any],
    *,
    path: str,
    by_name: bool,
    ignored: tuple[str, ...] = (),
    dropout_path: str | None = None,
) -> torch.Tensor:
    """What a block's attention adds to the residual: its module at `path` on the norm output
    (passed as `hidden_states=` when `by_name`, else first), with the block's call arguments minus
    `ignored` ones, output[0], then the block's residual dropout module if it has one."""
    arguments = {name: value for name, value in call.items() if name not in ignored}
    attention = submodule(block, path)
    output = attention(hidden_states=normed, **arguments) if by_name else attention(normed, **arguments)
    output = output[0] if isinstance(output, tuple) else output
    return output if dropout_path is None else submodule(block, dropout_path)(output)


def run_mlp(
    block: nn.Module, normed: torch.Tensor, *, chain: tuple[str, ...], dropout_path: str | None = None
) -> torch.Tensor:
    """What a block's MLP adds to the residual: the modules of `chain` applied in turn (one MLP
    module, or e.g. OPT's fc1, activation, fc2), then the residual dropout module if any."""
    output = normed
    for path in chain:
        output = submodule(block, path)(output)
    return output if dropout_path is None else submodule(block, dropout_path)(output)


def norm_epsilon(norm: nn.Module) -> float:
    """The epsilon added to the mean square by LayerNorm / RMSNorm implementations."""
    for attribute in ("variance_epsilon", "eps", "epsilon"):
        value = getattr(norm, attribute, None)
        if isinstance(value, float | int):
            return float(value)
    raise ValueError(f"cannot find the epsilon of norm {type(norm).__name__}")


class RMSNormNoScale(nn.Module):
    """x / sqrt(sum(x^2) / D + eps): RMSNorm without a learned scale, D fixed at construction."""

    def __init__(self, full_width: int, eps: float) -> None:
        super().__init__()
        self.full_width = full_width  # D of the dense model, kept after slicing
        self.eps = eps  # the replaced norm's epsilon, so sliced-at-zero stays exact

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()  # (..., d)
        mean_square = x32.pow(2).sum(dim=-1, keepdim=True) / self.full_width  # (..., 1)
        return (x32 * torch.rsqrt(mean_square + self.eps)).to(x.dtype)

    def extra_repr(self) -> str:
        return f"full_width={self.full_width}, eps={self.eps}"


class ProjectedRMSNorm(nn.Module):
    """(x / sqrt(mean(x^2) + eps)) @ P: a branch-output RMSNorm over the branch's full width D whose
    scale is folded, with the rotation into the sliced basis, into P (D, d): P = diag(scale) Q[:, :d].

    Exact for any d: the mean square is taken before the projection, over the same D coordinates
    the dense norm saw; only the directions the next signal keeps are dropped after it."""

    def __init__(self, projection: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.projection = nn.Parameter(projection, requires_grad=False)  # (D, d)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()  # (..., D)
        normed = x32 * torch.rsqrt(x32.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (normed @ self.projection.float()).to(x.dtype)  # (..., d)

    def extra_repr(self) -> str:
        full, kept = self.projection.shape
        return f"full_width={full}, width={kept}, eps={self.eps}"


def _optional_parameter(matrix: torch.Tensor | None) -> nn.Parameter | None:
    return None if matrix is None else nn.Parameter(matrix, requires_grad=False)


def _skip(x: torch.Tensor, matrix: torch.Tensor | None) -> torch.Tensor:
    return x if matrix is None else x @ matrix


class WrappedBlock(nn.Module):
    """Holds an original decoder block and the family adapter that knows how to call its parts.

    The wrapper accepts exactly the arguments the HF decoder passes to the original block, so the
    sliced model still runs through the stock HF forward (generation and caches included).
    """

    def __init__(self, block: nn.Module, adapter: BlockAdapter) -> None:
        super().__init__()
        self.block = block
        self.adapter = adapter  # stateless; a plain attribute, not a submodule
        self._signature = inspect.signature(block.forward)

    def call_arguments(
        self, hidden_states: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> dict[str, Any]:
        """The block's arguments by name (positional ones included), hidden states left out."""
        bound = self._signature.bind(hidden_states, *args, **kwargs)
        named: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            parameter = self._signature.parameters[name]
            if parameter.kind is inspect.Parameter.VAR_KEYWORD:
                named.update(value)
            elif parameter.kind is not inspect.Parameter.VAR_POSITIONAL:
                named[name] = value
        first = next(iter(self._signature.parameters))
        named.pop(first)
        return named


class SkipConnectedBlock(WrappedBlock):
    """A sequential pre-norm block whose residual adds go through skip matrices.

        h = x @ S_attn + attn(norm_1(x))      # (B, T, d_in) -> (B, T, d_mid)
        y = h @ S_mlp + mlp(norm_2(h))        # (B, T, d_mid) -> (B, T, d_out)

    A missing skip matrix means the identity.
    """

    def __init__(
        self,
        block: nn.Module,
        adapter: BlockAdapter,
        attn_skip: torch.Tensor | None = None,
        mlp_skip: torch.Tensor | None = None,
    ) -> None:
        super().__init__(block, adapter)
        self.attn_skip = _optional_parameter(attn_skip)  # (d_in, d_mid)
        self.mlp_skip = _optional_parameter(mlp_skip)  # (d_mid, d_out)

    def set_skips(self, attn_skip: torch.Tensor | None, mlp_skip: torch.Tensor | None) -> None:
        self.attn_skip = _optional_parameter(attn_skip)
        self.mlp_skip = _optional_parameter(mlp_skip)

    def attention_output(self, x: torch.Tensor, call: dict[str, Any]) -> torch.Tensor:
        """attn(norm_1(x)), what the attention branch adds: (B, T, d_in) -> (B, T, d_mid)."""
        return self.adapter.attention_branch(self.block, self.adapter.attn_norm(self.block)(x), call)

    def mlp_output(self, h: torch.Tensor) -> torch.Tensor:
        """mlp(norm_2(h)), what the MLP branch adds: (B, T, d_mid) -> (B, T, d_out)."""
        return self.adapter.mlp_branch(self.block, self.adapter.mlp_norm(self.block)(h))

    def attention_residual(self, x: torch.Tensor, call: dict[str, Any]) -> torch.Tensor:
        """h = x @ S_attn + attn(norm_1(x))."""
        return _skip(x, self.attn_skip) + self.attention_output(x, call)

    def mlp_residual(self, h: torch.Tensor) -> torch.Tensor:
        """y = h @ S_mlp + mlp(norm_2(h))."""
        return _skip(h, self.mlp_skip) + self.mlp_output(h)

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        call = self.call_arguments(hidden_states, args, kwargs)
        return self.mlp_residual(self.attention_residual(hidden_states, call))


class ParallelSkipConnectedBlock(WrappedBlock):
    """A parallel-residual block (attention and MLP both read the block input) with one skip:

        y = x @ S + attn(norm_1(x)) + mlp(norm_2(x))   # (B, T, d_in) -> (B, T, d_out)

    norm_1 and norm_2 may be one module (Phi-2). A missing skip matrix means the identity.
    """

    def __init__(self, block: nn.Module, adapter: BlockAdapter, skip: torch.Tensor | None = None) -> None:
        super().__init__(block, adapter)
        self.skip = _optional_parameter(skip)  # (d_in, d_out)

    def set_skip(self, skip: torch.Tensor | None) -> None:
        self.skip = _optional_parameter(skip)

    def branches_output(self, x: torch.Tensor, call: dict[str, Any]) -> torch.Tensor:
        """attn(norm_1(x)) + mlp(norm_2(x)), what the two branches add: (B, T, d_in) -> (B, T, d_out)."""
        attn_norm, mlp_norm = self.adapter.attn_norm(self.block), self.adapter.mlp_norm(self.block)
        attn_in = attn_norm(x)  # (B, T, d_in)
        mlp_in = attn_in if mlp_norm is attn_norm else mlp_norm(x)
        attention = self.adapter.attention_branch(self.block, attn_in, call)  # (B, T, d_out)
        return attention + self.adapter.mlp_branch(self.block, mlp_in)

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        call = self.call_arguments(hidden_states, args, kwargs)
        return _skip(hidden_states, self.skip) + self.branches_output(hidden_states, call)


def wrap_block(block: nn.Module, adapter: BlockAdapter) -> SkipConnectedBlock | ParallelSkipConnectedBlock:
    """The skip-connected wrapper matching the block's residual structure, skips at identity."""
    if adapter.is_parallel(block):
        return ParallelSkipConnectedBlock(block, adapter)
    return SkipConnectedBlock(block, adapter)


def unwrap(block: nn.Module) -> nn.Module:
    """The original decoder block, whether or not it is wrapped for skip connections."""
    return block.block if isinstance(block, WrappedBlock) else block


BRANCHES = ("attention", "mlp")  # the two residual branches of a block, as `branch` arguments name them


class FamilyLayout:
    """Where one family's parts are and how a block's branches are called, as data (dotted module
    paths and flags), with the accessors and branch calls that read it. The engine's
    `FamilyAdapter` subclasses it with a family's class attributes; an exported checkpoint rebuilds
    one from its `declaration` (`from_declaration`), so both find and call every part alike.
    (Residual dropout runs as the module it is; OPT's functional dropout is its adapter's own code,
    an identity in eval mode, where exported checkpoints run.)"""

    name: ClassVar[str]  # family name, as in core.families

    # Paths relative to the *ForCausalLM model.
    decoder_path: ClassVar[str]  # the module that owns embeddings, blocks and final norm
    blocks_path: ClassVar[str]  # nn.ModuleList of decoder blocks
    embedding_paths: ClassVar[tuple[str, ...]]  # token embedding first, then learned positions
    final_norm_path: ClassVar[str]
    head_path: ClassVar[str] = "lm_head"

    # Paths relative to one decoder block.
    attn_norm_path: ClassVar[str]
    attn_reader_paths: ClassVar[tuple[str, ...]]  # linears reading the attention norm's output
    attn_writer_paths: ClassVar[tuple[str, ...]]  # linears adding the attention output to the stream
    mlp_norm_path: ClassVar[str]
    mlp_reader_paths: ClassVar[tuple[str, ...]]
    mlp_writer_paths: ClassVar[tuple[str, ...]]
    # A norm on a branch's output before the residual add (Gemma-2/3's post-norms), if the family has
    # one: the branch ends there, and slicing projects after it instead of rotating the writers.
    attn_output_norm_path: ClassVar[str | None] = None
    mlp_output_norm_path: ClassVar[str | None] = None

    # How a block's branches are called (`run_attention` / `run_mlp`).
    attention_path: ClassVar[str] = "self_attn"
    attention_by_name: ClassVar[bool] = True  # hidden_states= rather than positional
    attention_ignored: ClassVar[tuple[str, ...]] = ()  # block call arguments the attention does not take
    attention_dropout_path: ClassVar[str | None] = None
    mlp_chain: ClassVar[tuple[str, ...]] = ("mlp",)
    mlp_dropout_path: ClassVar[str | None] = None
    parallel_attribute: ClassVar[str | None] = None  # block attribute that says parallel, if it varies
    parallel_default: ClassVar[bool] = False

    DECLARED: ClassVar[tuple[str, ...]] = (
        "name",
        "decoder_path",
        "blocks_path",
        "embedding_paths",
        "final_norm_path",
        "head_path",
        "attn_norm_path",
        "attn_reader_paths",
        "attn_writer_paths",
        "mlp_norm_path",
        "mlp_reader_paths",
        "mlp_writer_paths",
        "attn_output_norm_path",
        "mlp_output_norm_path",
        "attention_path",
        "attention_by_name",
        "attention_ignored",
        "attention_dropout_path",
        "mlp_chain",
        "mlp_dropout_path",
        "parallel_attribute",
        "parallel_default",
    )

    def declaration(self) -> dict[str, Any]:
        """Everything above as plain data (what an exported checkpoint's config.json holds)."""
        return {key: getattr(self, key) for key in self.DECLARED}

    @classmethod
    def from_declaration(cls, declaration: dict[str, Any]) -> FamilyLayout:
        """The layout a `declaration` describes (JSON lists back to tuples). A key that older
        checkpoints do not declare (the output norms) keeps the class default."""
        values = {key: tuple(v) if isinstance(v, list) else v for key, v in declaration.items()}
        declared = {key: values[key] for key in cls.DECLARED if key in values}
        return type(f"Declared{cls.__name__}", (cls,), declared)()

    # ---- accessors ----------------------------------------------------------------------------

    def decoder(self, model: nn.Module) -> nn.Module:
        return get_path(model, self.decoder_path)

    def blocks(self, model: nn.Module) -> nn.ModuleList:
        return get_path(model, self.blocks_path)

    def embeddings(self, model: nn.Module) -> list[nn.Embedding]:
        return [get_path(model, path) for path in self.embedding_paths]

    def final_norm(self, model: nn.Module) -> nn.Module:
        return get_path(model, self.final_norm_path)

    def set_final_norm(self, model: nn.Module, norm: nn.Module) -> None:
        set_path(model, self.final_norm_path, norm)

    def lm_head(self, model: nn.Module) -> nn.Linear:
        return get_path(model, self.head_path)

    def attn_norm(self, block: nn.Module) -> nn.Module:
        return get_path(unwrap(block), self.attn_norm_path)

    def mlp_norm(self, block: nn.Module) -> nn.Module:
        return get_path(unwrap(block), self.mlp_norm_path)

    def set_attn_norm(self, block: nn.Module, norm: nn.Module) -> None:
        set_path(unwrap(block), self.attn_norm_path, norm)

    def set_mlp_norm(self, block: nn.Module, norm: nn.Module) -> None:
        set_path(unwrap(block), self.mlp_norm_path, norm)

    def output_norm_path(self, branch: str) -> str | None:
        """Where the norm on `branch`'s output ("attention" or "mlp") is, or None if it has none."""
        return self.attn_output_norm_path if branch == "attention" else self.mlp_output_norm_path

    def output_norm(self, block: nn.Module, branch: str) -> nn.Module | None:
        path = self.output_norm_path(branch)
        return None if path is None else get_path(unwrap(block), path)

    def set_output_norm(self, block: nn.Module, branch: str, norm: nn.Module) -> None:
        path = self.output_norm_path(branch)
        if path is None:
            raise ValueError(f"the {self.name} family has no norm on the {branch} output")
        set_path(unwrap(block), path, norm)

    def writers(self, block: nn.Module, branch: str) -> list[nn.Module]:
        """The linears `branch` ("attention" or "mlp") writes into the stream with."""
        return self.attn_writers(block) if branch == "attention" else self.mlp_writers(block)

    def attn_readers(self, block: nn.Module) -> list[nn.Module]:
        return [get_path(unwrap(block), path) for path in self.attn_reader_paths]

    def attn_writers(self, block: nn.Module) -> list[nn.Module]:
        return [get_path(unwrap(block), path) for path in self.attn_writer_paths]

    def mlp_readers(self, block: nn.Module) -> list[nn.Module]:
        return [get_path(unwrap(block), path) for path in self.mlp_reader_paths]

    def mlp_writers(self, block: nn.Module) -> list[nn.Module]:
        return [get_path(unwrap(block), path) for path in self.mlp_writer_paths]

    # ---- residual structure and branch calls --------------------------------------------------

    def is_parallel(self, block: nn.Module) -> bool:
        """True if attention and MLP both read the block input (y = x + attn(x) + mlp(x)):
        such a block has one input basis, one output basis and one skip matrix. Sequential
        blocks (h = x + attn(x); y = h + mlp(h)) have a basis between attention and MLP too."""
        if self.parallel_attribute is None:
            return self.parallel_default
        return bool(getattr(unwrap(block), self.parallel_attribute, self.parallel_default))

    def attention_branch(self, block: nn.Module, normed: torch.Tensor, call: dict[str, Any]) -> torch.Tensor:
        """What the block adds to the residual for attention, given the attention norm's output and
        the block's call arguments by name (attention mask, position info, cache...): the output
        norm's result where the branch has one."""
        output = run_attention(
            unwrap(block),
            normed,
            call,
            path=self.attention_path,
            by_name=self.attention_by_name,
            ignored=self.attention_ignored,
            dropout_path=self.attention_dropout_path,
        )
        return self._through_output_norm(block, "attention", output)

    def mlp_branch(self, block: nn.Module, normed: torch.Tensor) -> torch.Tensor:
        """What the block adds to the residual for the MLP, given the MLP norm's output."""
        output = run_mlp(unwrap(block), normed, chain=self.mlp_chain, dropout_path=self.mlp_dropout_path)
        return self._through_output_norm(block, "mlp", output)

    def _through_output_norm(self, block: nn.Module, branch: str, output: torch.Tensor) -> torch.Tensor:
        norm = self.output_norm(block, branch)
        return output if norm is None else norm(output)

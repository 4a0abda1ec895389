"""The GRAPH-mode bodies every MindSpore network's clipped sum shares (networks.py): the output
gradients of the probed layers and the clip weights, per example, and the clipped sum per person
from the factors of the network's per-example gradients.
"""
import mindspore as ms
import numpy as np
from mindspore import nn, ops


class ClippedSumGraph(nn.Cell):
    """The GRAPH-mode body of a clipped per-example gradient sum: the output gradients of
    `net.forward`'s probed layers (the probes must be inputs of the graph: MindSpore folds zeros
    made inside it into constants, which have no gradient), and the clip weights min(1, C / ‖g_i‖)
    of per-example squared norms. A graph returns the clipped sums in GRADIENT_ORDER, how many were
    not clipped, and each example's squared gradient norm per parameter [B, parameters]: each term
    of the norm is tested on its own (a small one is lost in the total)."""

    def __init__(self, net):
        super().__init__(auto_prefix=False)
        self.net = net
        self.loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="sum")
        self.output_grads = ms.grad(self.probed_loss, grad_position=1, has_aux=True)
        self.batch_matmul_tb = ops.BatchMatMul(transpose_b=True)
        self.matmul_ta = ops.MatMul(transpose_a=True)
        self.batch_matmul_ta = ops.BatchMatMul(transpose_a=True)
        params = net.parameters_dict()
        self.shapes = tuple(tuple(params[name].shape) for name in net.GRADIENT_ORDER)

    def probed_loss(self, x, probes, y):
        """The summed loss, with zero probes added to the weighted layers' outputs.

        Args:
          x: the examples.
          probes: zeros added to each weighted layer's output, the last the logits.
          y: their labels.

        Returns:
          (the summed loss, then what `net.forward` returns beside the logits: what each weighted
          layer's per-example gradient needs, `output_grads`' auxiliary outputs).
        """
        logits, inputs = self.net.forward(x, probes)
        return (self.loss(logits, y),) + inputs

    @staticmethod
    def clip_weights(squared_norms, mask, max_grad_norm):
        """Each example's clipping factor.

        Args:
          squared_norms: each example's squared gradient norm per parameter [B, parameters].
          mask: [B], 1 for an example, 0 for padding.
          max_grad_norm: C.

        Returns:
          ([B] factors mask_i · min(1, C / ‖g_i‖), how many unmasked examples had ‖g_i‖ ≤ C:
          adaptive clipping's count).
        """
        norms = ops.sqrt(squared_norms.sum(1))
        weight = ops.minimum(1.0, max_grad_norm / ops.maximum(norms, 1e-12)) * mask
        return weight, ((norms <= max_grad_norm).astype(ms.float32) * mask).sum()

    @staticmethod
    def dense_norms(grads, inputs):
        """A dense layer's per-example squared weight and bias gradient norms [B] each, from its
        output gradients g_i and inputs a_i: the weight gradient g_i a_iᵀ has squared norm
        ‖g_i‖²‖a_i‖², the bias's is ‖g_i‖²."""
        squares = ops.square(grads).sum(1)
        return squares * ops.square(inputs).sum(1), squares

    def gradient_factors(self, x, y, probes):
        """The factors of each example's gradient of every parameter, for clipping per person:
        the gradient is Σ over positions of g aᵀ, g the output gradient and a the input at a
        position (a dense layer: one position; a bias: inputs of ones).

        Args:
          x: the chunk's examples, as the network takes them.
          y: their labels.
          probes: the zero probes, as the graph takes them.

        Returns:
          In GRADIENT_ORDER, (g [B, positions, out], a [B, positions, in]) each, [out, in] the
          layout `to_weights` reads.
        """
        raise NotImplementedError

    def to_weights(self, sums):
        """Flat sums of gradient_factors' layouts -> the parameters' shapes, in GRADIENT_ORDER."""
        return self.reshaped(sums)

    def reshaped(self, sums):
        """Flat sums -> the parameters' shapes, in GRADIENT_ORDER, each reshaped as it is."""
        shaped = ()
        for s, shape in zip(sums, self.shapes):
            shaped += (s.reshape(shape),)
        return shaped

    @staticmethod
    def dense(grads, inputs):
        """A dense layer's weight and bias gradient factors (gradient_factors'): [B, out], [B, in]
        -> ((g [B, 1, out], a [B, 1, in]), (g, ones [B, 1, 1]))."""
        g = grads.reshape(grads.shape[0], 1, -1)
        return (g, inputs.reshape(inputs.shape[0], 1, -1)), (g, ops.ones_like(g[:, :, :1]))


class PersonClippedSum(nn.Cell):
    """Σ_p min(1, C / ‖G_p‖) G_p over one chunk's persons, G_p the sum of person p's examples'
    gradients, and how many persons had ‖G_p‖ ≤ C. The chunk is a grid (chunks.person_grids): a
    row of examples per person, so G_p is one batched product of the row's gradient factors (the
    network graph's gradient_factors). Returns what a network's graph returns, each person's
    squared norms per parameter [R, parameters] in place of the examples' (rows beyond the chunk's
    persons are zeros)."""

    def __init__(self, graph):
        super().__init__(auto_prefix=False)
        self.graph = graph

    def construct(self, x, y, mask, max_grad_norm, person_mask, *probes):
        """The clipped sum over one chunk.

        Args:
          x: the chunk's examples, as the network takes them, R rows of k, a person's a row.
          y: their labels.
          mask: [R·k], 1 for an example, 0 for padding.
          max_grad_norm: C.
          person_mask: [R], 1 for a row holding a person, 0 for padding.
          *probes: the zero probes, as the network's graph takes them.

        Returns:
          The clipped sums in GRADIENT_ORDER, how many persons had ‖G_p‖ ≤ C, and each person's
          squared gradient norm per parameter [R, parameters].
        """
        rows, column = person_mask.shape[0], mask.reshape(-1, 1, 1)
        sums = ()
        for grads, inputs in self.graph.gradient_factors(x, y, probes):
            # -> [R, out, in]: over the row's examples and their positions
            person = self.graph.batch_matmul_ta((grads * column).reshape(rows, -1, grads.shape[2]),
                                                inputs.reshape(rows, -1, inputs.shape[2]))
            sums += (person.reshape(rows, -1),)
        squares = ()
        for s in sums:
            squares += (ops.square(s).sum(1),)
        squared_norms = ops.stack(squares, 1)
        weight, unclipped = self.graph.clip_weights(squared_norms, person_mask, max_grad_norm)
        row = weight.reshape(1, -1)
        clipped = ()
        for s in sums:
            clipped += (ops.matmul(row, s).reshape(-1),)
        return self.graph.to_weights(clipped) + (unclipped, squared_norms)


class ClippedGradientSum:
    """Σ_i mask_i · min(1, C / ‖g_i‖) · g_i over one chunk from exact per-example gradients (one
    backward pass to each layer's output, each example's gradient from its layer inputs), in
    `weights` order, then how many had ‖g_i‖ ≤ C; per person, the same over the chunk's persons
    (PersonClippedSum). Per example, a network with `data_rows` needs these examples' rows of
    them: its norms rest on them, so none is refused."""

    def __init__(self, net, weights, per_person=False):
        if tuple(w.name for w in weights) != net.GRADIENT_ORDER:
            raise ValueError(f"ClippedGradientSum returns {net.GRADIENT_ORDER}, not "
                             f"{[w.name for w in weights]}")
        self.graph = net.clipped_sum_graph(per_person)
        self.probe_shapes = net.probe_shapes
        self.takes_rows = hasattr(net, "data_rows") and not per_person
        self.per_person = per_person
        self.probes = {}  # chunk size -> zero probes

    def __call__(self, x, y, mask, max_grad_norm, rows=None, persons=None):
        return self.run(x, y, mask, max_grad_norm, rows, persons)[:-1]

    def squared_norms(self, x, y, rows=None, persons=None):
        """Each example's (person's) squared gradient norm per parameter.

        Args:
          x, y: the chunk's examples, as the network takes them, and their labels.
          rows: their data rows if the network takes them, else None.
          persons: `inputs`' persons, exactly when per person.
        Returns:
          [B, parameters] in `weights` order."""
        return self.run(x, y, ms.Tensor(np.ones(x.shape[0], np.float32)), 1.0, rows, persons)[-1]

    def run(self, x, y, mask, max_grad_norm, rows, persons=None):
        """The graph run on one chunk.

        Args:
          x, y: the chunk's examples, as the network takes them, and their labels.
          mask: 1 for an example, 0 for padding.
          max_grad_norm: C.
          rows: their data rows if the network takes them, else None.
          persons: `inputs`' persons, exactly when per person.
        Returns:
          The clipped sums in `weights` order, how many had ‖g_i‖ ≤ C, the squared norms."""
        return self.graph(*self.inputs(x, y, mask, max_grad_norm, rows, persons))

    def inputs(self, x, y, mask, max_grad_norm, rows, persons=None):
        """The graph's inputs for one chunk, the zero probes made once per chunk size.

        Args:
          x, y: the chunk's examples, as the network takes them, and their labels.
          mask: 1 for an example, 0 for padding.
          max_grad_norm: C.
          rows: their data rows exactly if the network takes them, else None (ValueError otherwise).
          persons: 1 for each row of the chunk's grid holding a person [R] (chunks.person_grids),
            numpy, exactly when per person (PersonClippedSum's person_mask).
        Returns:
          (the examples, their labels and mask, C, their persons or data rows if any, the zero
          probes)."""
        if (rows is None) == self.takes_rows:
            raise ValueError("this network's clipped sum takes " + (
                "its chunk's data rows" if self.takes_rows else "no data rows"))
        if (persons is None) == self.per_person:
            raise ValueError("a clipped sum takes its chunk's persons exactly when per person")
        size = x.shape[0]
        if size not in self.probes:
            self.probes[size] = tuple(ms.Tensor(np.zeros((size, *shape), np.float32))
                                      for shape in self.probe_shapes)
        given = () if rows is None else (ms.Tensor(rows),)
        if persons is not None:
            given = (ms.Tensor(persons),)
        return (x, y, mask, ms.Tensor(max_grad_norm, ms.float32), *given, *self.probes[size])

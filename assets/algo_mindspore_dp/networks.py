"""The MindSpore algo's networks, each with the GRAPH-mode body of its clipped per-example gradient
sum, and its per-example gradients, which clipped_sums.PersonClippedSum sums per person. Every
network is built from its declaration (mnist_dp/architectures.py: `DeclaredNet`, clipped by
`DeclaredClippedSum` with one rule per layer type), but the ScatterNet CNN, made by hand from the
kernels that run fast (`ScatterNetCNN`).

Book-keeping, as the tf algo: one backward pass to every weighted layer's output gives each
example's gradient there (row i of the output gradient is example i's: its loss depends only on its
own row), and a layer's per-example weight gradient is that output gradient times the layer's input.
So each network's `forward` returns its layers' inputs and adds zero "probes" to its layers'
outputs, w.r.t. which the loss is differentiated.

MindSpore 2.9's CPU kernels shape this code (timings in docs/benchmarks.md): its Conv2D hands oneDNN
plain NCHW tensors and gets oneDNN's reference convolution; Im2Col, Pad, strided slices, broadcast
batched products and the generic gradients of MatMul and ReduceMean cost several times the
arithmetic. Gathers, 2-D matrix products and cells that give their own gradient (`bprop`) are fast,
so the ScatterNet CNN is built from those (its layers are in layers.py).
"""
import layers  # beside this file: the ScatterNet CNN's layers
import mindspore as ms
import numpy as np
from clipped_sums import ClippedSumGraph, PersonClippedSum  # beside this file
from mindspore import nn, ops

from mnist_dp import architectures
from mnist_dp.learning import conv_grams, features
from mnist_dp.learning.interface import GROUP_SIZE, MNIST_MEAN, MNIST_STD, Network


def _probed(z, probes, index):
    """z + probes[index]: with a zero probe, the gradient w.r.t. the probe is the gradient w.r.t.
    z."""
    return z if probes is None else z + probes[index]


def _activation(name):
    return {"tanh": nn.Tanh, "relu": nn.ReLU}[name]()  # "tanh" or "relu", as the other algos


# --- The TF Privacy / Opacus tutorial CNN, on pixels
# ----------------------------------------------------------------

class PatchConv2d(nn.Conv2d):
    """`nn.Conv2d` (same parameters, names and initialisation), computed as Im2Col patches times the
    kernel matrix (the module docstring says why). Output [B, out_channels, H', W'] as Conv2d's.
    Handles what this CNN uses: groups 1, dilation 1, one padding for every side; a bias unless told
    not to."""

    def __init__(self, *args, has_bias=True, **kwargs):
        super().__init__(*args, has_bias=has_bias, **kwargs)
        if (self.group != 1 or tuple(self.dilation[-2:]) != (1, 1)
            or not isinstance(self.padding, int)):
            raise ValueError("PatchConv2d: groups 1, dilation 1 and an int padding only")
        self.batch_matmul, self.bias_add = ops.BatchMatMul(), ops.BiasAdd()

    def patches(self, x):
        """[B, C, H, W] -> [B, C·kh·kw, H'·W']: each output position's input, in the weight's
        (C, kh, kw) order."""
        return ops.unfold(x, self.kernel_size, 1, self.padding, self.stride)

    def pre_activation(self, patches):
        """Patches -> the convolution's output [B, out_channels, H'·W'] (bias added)."""
        kernel = self.weight.reshape(self.out_channels, -1)  # -> [out, C·kh·kw]
        kernels = ops.broadcast_to(kernel, (patches.shape[0],) + kernel.shape)  # one per example
        return self.bias_add(self.batch_matmul(kernels, patches), self.bias)

    def construct(self, x):
        (kh, kw), (sh, sw) = self.kernel_size, self.stride[-2:]
        height = (x.shape[2] + 2 * self.padding - kh) // sh + 1
        width = (x.shape[3] + 2 * self.padding - kw) // sw + 1
        return self.pre_activation(self.patches(x)).reshape(
            x.shape[0], self.out_channels, height, width)


class DeclaredNet(nn.Cell):
    """A network of mnist_dp/architectures.py from plain layers, each with parameters a cell named
    as declared: a convolution as PatchConv2d, a dense layer as nn.Dense, a normalisation as
    layers.GroupNorm of the flattened maps, MindSpore's activation and pool. `forward` adds zero
    probes to each weighted layer's output and returns what each one's per-example gradient needs;
    DeclaredClippedSum is its clipped sum."""

    def __init__(self, architecture, activation="tanh"):
        super().__init__()
        self.pixels, self.input_maps = architecture.features == "pixels", architecture.input_maps
        self.maps = architecture.reads_maps
        self.steps, self.probe_shapes = (), ()  # (kind, name, output shape) per declared layer
        for layer, (shape, out) in zip(architecture.layers, architecture.shapes()):
            name = getattr(layer, "name", "")
            if isinstance(layer, architectures.Conv):
                padding = {"pad_mode": "pad", "padding": layer.padding} if layer.padding else {
                    "pad_mode": "valid"}
                setattr(self, name, PatchConv2d(layer.channels_in, layer.channels_out,
                                                layer.kernel, stride=layer.stride, **padding))
                self.probe_shapes += ((out[0], out[1] * out[2]),)
            elif isinstance(layer, architectures.Dense):
                setattr(self, name, nn.Dense(layer.width_in, layer.width_out,
                                             has_bias=layer.bias))
                self.probe_shapes += (out,)
            elif isinstance(layer, architectures.GroupNorm):  # maps flattened channel-first
                setattr(self, name, layers.GroupNorm(np.repeat(
                    np.arange(shape[0]) // GROUP_SIZE, shape[1] * shape[2])))
            self.steps += ((type(layer).__name__, name, out),)
        self.flatten, self.pool = nn.Flatten(), nn.MaxPool2d(2, 1)
        self.act = _activation(activation)
        self.has_shortcut = architecture.shortcut is not None
        if self.has_shortcut:
            setattr(self, architecture.shortcut.name, nn.Dense(
                architecture.shortcut.width_in, 10, has_bias=False))
            self.shortcut_name = architecture.shortcut.name
        # The parameters, in the order its clipped sum returns their gradients.
        self.GRADIENT_ORDER = tuple(name for name, _, _ in architecture.layout())
        self.weighted = architecture.weighted

    def construct(self, x):
        return self.forward(x)[0]

    def forward(self, x, probes=None):
        """Logits, and the input of each weighted layer (a convolution's patches; the shortcut's
        last); `probes` (zeros shaped [B, *probe_shapes[i]]) are added to each layer's output, the
        last's after the shortcut's."""
        batch = x.shape[0]
        x = x.astype(ms.float32)  # a task's features are float16 (features.py)
        flat_in, inputs, index = x, (), 0
        if self.pixels:
            x = (x - MNIST_MEAN) / MNIST_STD
        elif self.maps:
            x = x.reshape((batch,) + self.input_maps)  # -> [B, 81, 7, 7]
        for kind, name, shape in self.steps:
            if kind == "Conv":
                inputs += (getattr(self, name).patches(x),)  # -> [B, C·kh·kw, H'·W']
                x = _probed(getattr(self, name).pre_activation(inputs[-1]), probes,
                            index).reshape((batch,) + shape)
                index += 1
            elif kind == "Dense":
                if len(x.shape) == 4:
                    x = self.flatten(x)  # -> [B, C·H·W]
                inputs += (x,)
                x = getattr(self, name)(x)
                if self.has_shortcut and index == len(self.probe_shapes) - 1:
                    x = x + getattr(self, self.shortcut_name)(flat_in)
                x = _probed(x, probes, index)
                index += 1
            elif kind == "GroupNorm":
                x = getattr(self, name)(x.reshape(batch, -1)).reshape((batch,) + shape)
            elif kind == "Activation":
                x = self.act(x)
            else:
                x = self.pool(x)
        return x, inputs + ((flat_in,) if self.has_shortcut else ())

    def clipped_sum_graph(self, per_person=False):
        graph = DeclaredClippedSum(self)
        return PersonClippedSum(graph) if per_person else graph


class TutorialCNN(DeclaredNet):
    """The TF Privacy / Opacus tutorial CNN on pixels [B, 1, 28, 28] in [0, 1]."""

    def __init__(self, activation="tanh"):
        super().__init__(architectures.of(Network("pixels", activation, "cnn")), activation)


class ScatteringLinear(DeclaredNet):
    """The linear classifier on scattering features [B, 3969]."""

    def __init__(self):
        super().__init__(architectures.of(Network("scattering", "tanh", "linear")))


class DeclaredClippedSum(ClippedSumGraph):
    """A DeclaredNet's clipped sum, one rule per weighted layer: a convolution's per-example kernel
    gradients from its patches (batched products), a dense layer's from its input, the shortcut
    sharing the last layer's output gradient."""

    def __init__(self, net):
        super().__init__(net)
        last = len(net.probe_shapes) - 1  # (kind, its probe, has a bias, its weight's shape)
        self.rules = tuple((type(layer).__name__, min(index, last), getattr(layer, "bias", True),
                            layer.parameters()[0][1]) for index, layer in enumerate(net.weighted))

    def construct(self, x, y, mask, max_grad_norm, *probes):
        """The clipped sum over one chunk.

        Args:
          x: the chunk's examples, as the network takes them.
          y: their labels.
          mask: [B], 1 for an example, 0 for padding.
          max_grad_norm: C.
          *probes: zeros [B, *probe_shapes[i]], added to each weighted layer's output.

        Returns:
          The clipped sums in GRADIENT_ORDER, how many had ‖g_i‖ ≤ C, and each example's squared
          gradient norm per parameter [B, parameters].
        """
        grads, inputs = self.output_grads(x, probes, y)
        # per weighted layer: a convolution's per-example kernels, a dense layer's input; its bias's
        batch, squares, weights, biases = x.shape[0], (), (), ()
        for (kind, probe, bias, _), a in zip(self.rules, inputs):
            g = grads[probe]
            if kind == "Conv":  # per-example kernel gradients [B, out, C·kh·kw] and biases
                weights += (self.batch_matmul_tb(g, a),)
                biases += (g.sum(2),)
                squares += (ops.square(weights[-1]).reshape(batch, -1).sum(1),
                            ops.square(biases[-1]).sum(1))
            else:
                weights += (a,)
                biases += (g,)
                squares += self.dense_norms(g, a)[:2 if bias else 1]
        squared_norms = ops.stack(squares, 1)
        weight, unclipped = self.clip_weights(squared_norms, mask, max_grad_norm)
        row, column, sums = weight.reshape(1, -1), weight.reshape(-1, 1), ()
        for (kind, probe, bias, shape), w, b in zip(self.rules, weights, biases):
            if kind == "Conv":
                sums += (ops.matmul(row, w.reshape(batch, -1)).reshape(shape),)
            else:
                sums += (self.matmul_ta(grads[probe] * column, w),)
            if bias:
                sums += (ops.matmul(row, b).reshape(-1),)
        return sums + (unclipped, squared_norms)

    def gradient_factors(self, x, y, probes):
        """See ClippedSumGraph.gradient_factors: a convolution's inputs its patches [B, positions,
        C·kh·kw]."""
        grads, inputs = self.output_grads(x, probes, y)
        factors = ()
        for (kind, probe, bias, _), a in zip(self.rules, inputs):
            g = grads[probe]
            if kind == "Conv":
                g = ops.transpose(g, (0, 2, 1))  # -> [B, P, out]
                factors += ((g, ops.transpose(a, (0, 2, 1))), (g, ops.ones_like(g[:, :, :1])))
            else:
                factors += self.dense(g, a)[:2 if bias else 1]
        return factors


# --- Tramèr & Boneh's ScatterNet CNN, on scattering features
# --------------------------------------------------------

class ScatterNetCNN(nn.Cell):
    """Tramèr & Boneh's ScatterNet CNN on scattering features [B, 3969] (81 channels × 7 × 7,
    channel-major), its convolutions group-normalised, with a linear shortcut from the features to
    the logits (72,756 parameters): the other algos' network, the convolutions computed otherwise
    (the module docstring says why). The first is its patches (one gather of the features, channels
    last) times the kernel matrix, the second a Toeplitz product."""

    GRADIENT_ORDER = tuple(name for name, _, _ in architectures.of(
        Network("scattering", "tanh", "cnn")).layout())

    def __init__(self, activation="tanh"):
        super().__init__()
        channels, size = features.SCATTERING_CHANNELS, features.SCATTERING_SIZE
        self.conv1, self.conv2 = layers.ConvWeights(channels, 16, 3), layers.ConvWeights(16, 32, 3)
        self.fc1, self.fc2 = nn.Dense(32 * 16, 32), nn.Dense(32, 10)
        self.shortcut = nn.Dense(features.SCATTERING_DIM, 10, weight_init=0, has_bias=False)
        self.act = _activation(activation)
        # 7 × 7 -> 4 × 4 positions
        self.patches1, self.product1 = layers.PatchGather(size, 3, 2, 1), layers.DataProduct()
        self.product2 = layers.ToeplitzConv2d(4, 16, 32, 3, 1, 1)  # 4 × 4 -> 4 × 4
        self.bias_add = ops.BiasAdd()  # a broadcast Add is slower, and its gradient a ReduceSum
        # conv1's output: (position, channel)
        self.norm1 = layers.GroupNorm(np.tile(np.arange(16) // GROUP_SIZE, 16))
        # conv2's: (channel, position)
        self.norm2 = layers.GroupNorm(np.repeat(np.arange(32) // GROUP_SIZE, 16))
        self.probe_shapes = ((16, 16), (32, 16), (32,), (10,))

    def data_rows(self, x):
        """What the clipped sum needs of each example that no weight changes, made once per task
        (its step then takes a batch's rows): [N, 137] float32, the first convolution's packed patch
        Gram (that layer reads the features themselves: conv_grams.patch_grams) and the features'
        squared norm (the shortcut's input)."""
        size = features.SCATTERING_SIZE
        x = np.asarray(x).reshape(len(x), features.SCATTERING_CHANNELS, size, size)
        rows = np.empty((len(x), ROW_WIDTH), np.float32)
        rows[:, :-1] = conv_grams.patch_grams(x, *self.patches1.geometry)
        for start in range(0, len(x), conv_grams.CHUNK):
            block = x[
                start : start + conv_grams.CHUNK].reshape(-1, features.SCATTERING_DIM).astype(
                    np.float32)
            rows[start : start + len(block), -1] = np.einsum("ij,ij->i", block, block)
        return rows

    def construct(self, x):
        return self.forward(x)[0]

    def forward(self, x, probes=None):
        """Logits, and what each weighted layer's per-example gradient needs (the first
        convolution's patches, the second's input, the dense layers' inputs, the features in
        float32); `probes` (zeros shaped [B, *probe_shapes[i]]) are added to each layer's output."""
        batch = x.shape[0]
        x = x.astype(ms.float32)  # a task's features are float16 (features.py)
        pixels = ops.transpose(x.reshape(batch, 81, 49), (0, 2, 1))  # -> [B, 49, 81]: channels last
        patches1 = self.patches1(pixels).reshape(batch * 16, 9 * 81)  # -> [B·16, 729]
        # [B·16, 16]
        z1 = self.bias_add(self.product1(patches1, layers.kernel_matrix(self.conv1.weight)),
                           self.conv1.bias)
        z1 = _probed(z1.reshape(batch, 16, 16), probes, 0)  # [B, 16, 16]: position, channel
        # -> [B, 256]: conv2's input, channels last
        a1 = self.act(self.norm1(z1.reshape(batch, 256)))
        z2 = self.bias_add(self.product2(a1, self.conv2.weight).reshape(batch, 32, 16),
                           self.conv2.bias)
        z2 = _probed(z2, probes, 1)  # [B, 32, 16]: channel, position (NCHW)
        # -> [B, 512], flattened as the other algos'
        hidden_in = self.act(self.norm2(z2.reshape(batch, 512)))
        hidden = self.act(_probed(self.fc1(hidden_in), probes, 2))  # -> [B, 32]
        logits = _probed(self.fc2(hidden) + self.shortcut(x), probes, 3)  # -> [B, 10]
        return logits, (patches1, a1, hidden_in, hidden, x)

    def clipped_sum_graph(self, per_person=False):
        graph = _ScatterNetClippedSum(self)
        return PersonClippedSum(graph) if per_person else graph


# ScatterNetCNN.data_rows: a packed [16, 16] Gram, a squared norm
ROW_WIDTH = len(conv_grams.packed_pairs(16)) + 1


class _ScatterNetClippedSum(ClippedSumGraph):
    """The ScatterNet CNN's clipped sum. A convolution's per-example kernel gradient Σ_p g_p a_pᵀ
    (over positions p: g_p the output gradient, a_p the patch) has squared norm Σ_pq
    (g_p·g_q)(a_p·a_q), from two [16, 16] Grams per example (the first layer's patch Grams are the
    batch's data rows), and the clipped sum is one product of the weighted output gradients with the
    patches: no per-example kernel is formed."""

    def __init__(self, net):
        super().__init__(net)
        self.packed = ms.Tensor(conv_grams.packed_pairs(16).astype(np.int32))
        # Sums over positions as products with 0/1 matrices: MindSpore's ReduceSum over a middle
        # axis took longer.
        # (position, channel) -> channel
        self.position_sum1 = ms.Tensor(np.tile(np.eye(16, dtype=np.float32), (16, 1)))
        # (channel, position) -> channel
        self.position_sum2 = ms.Tensor(np.repeat(np.eye(32, dtype=np.float32), 16, 0))

    def construct(self, x, y, mask, max_grad_norm, rows, probe1, probe2, probe3, probe4):
        """The clipped sum over one chunk.

        Args:
          x: the chunk's scattering features [B, 3969].
          y: their labels.
          mask: [B], 1 for an example, 0 for padding.
          max_grad_norm: C.
          rows: the chunk's data rows [B, 137] (ScatterNetCNN.data_rows).
          probe1: zeros [B, 16, 16], added to conv1's output (position, channel).
          probe2: zeros [B, 32, 16], added to conv2's output (channel, position).
          probe3: zeros [B, 32], added to fc1's output.
          probe4: zeros [B, 10], added to the logits.

        Returns:
          The clipped sums in GRADIENT_ORDER, how many had ‖g_i‖ ≤ C, and each example's squared
          gradient norm per parameter [B, 9].
        """
        (g1, g2, g3, g4), (patches1, a1, hidden_in, hidden, x) = self.output_grads(
            x, (probe1, probe2, probe3, probe4), y)
        batch, net = x.shape[0], self.net
        patches1 = patches1.reshape(batch, 16, 9 * 81)
        patches2 = net.product2.patches(a1.reshape(batch, 16, 16))  # -> [B, 16, 144]
        # per-example bias gradients -> [B, 16]
        bias1 = ops.matmul(g1.reshape(batch, 256), self.position_sum1)
        bias2 = ops.matmul(g2.reshape(batch, 512), self.position_sum2)  # -> [B, 32]
        g2 = ops.transpose(g2, (0, 2, 1))  # -> [B, 16, 32]: position, channel, as g1
        # conv1's kernel: the output gradients' Gram at each pair of the rows' packed patch Gram.
        # The shortcut shares fc2's output gradient g4 (its bias term ‖g4‖²); its input is the
        # features, of squared norm the rows' last. -> [B, 136]
        output_grams = ops.gather(self.batch_matmul_tb(g1, g1).reshape(batch, -1), self.packed, 1)
        fc2_weight, logit_squares = self.dense_norms(g4, hidden)
        squared_norms = ops.stack((  # each example's, per parameter in GRADIENT_ORDER -> [B, 9]
            (output_grams * rows[:, :-1]).sum(1), ops.square(bias1).sum(1),
            self.kernel_norms(g2, patches2), ops.square(bias2).sum(1))
            + self.dense_norms(g3, hidden_in) + (fc2_weight, logit_squares,
                                                 logit_squares * rows[:, -1]), 1)
        weight, unclipped = self.clip_weights(squared_norms, mask, max_grad_norm)
        row, column, each = weight.reshape(1, -1), weight.reshape(-1, 1), weight.reshape(-1, 1, 1)
        return (layers.kernel_of(self.patch_product(g1 * each, patches1), net.conv1.weight.shape),
                ops.matmul(row, bias1).reshape(-1),
                layers.kernel_of(self.patch_product(g2 * each, patches2), net.conv2.weight.shape),
                ops.matmul(row, bias2).reshape(-1), self.matmul_ta(g3 * column, hidden_in),
                ops.matmul(row, g3).reshape(-1), self.matmul_ta(g4 * column, hidden),
                ops.matmul(row, g4).reshape(-1), self.matmul_ta(g4 * column, x), unclipped,
                squared_norms)

    def gradient_factors(self, x, y, probes):
        """See ClippedSumGraph.gradient_factors: a convolution's inputs its patches [B, 16, K]."""
        (g1, g2, g3, g4), (patches1, a1, hidden_in, hidden, x) = self.output_grads(
            x, probes, y)
        batch = x.shape[0]
        patches2 = self.net.product2.patches(a1.reshape(batch, 16, 16))  # -> [B, 16, 144]
        g2 = ops.transpose(g2, (0, 2, 1))  # -> [B, 16, 32]: position, channel, as g1
        return ((g1, patches1.reshape(batch, 16, 9 * 81)), (g1, ops.ones_like(g1[:, :, :1])),
                (g2, patches2), (g2, ops.ones_like(g2[:, :, :1]))) \
            + self.dense(g3, hidden_in) + self.dense(g4, hidden) + self.dense(g4, x)[:1]

    def to_weights(self, sums):
        """See ClippedSumGraph.to_weights: the kernels through layers.kernel_of."""
        shaped, net = self.reshaped(sums), self.net
        return ((layers.kernel_of(sums[0].reshape(16, -1), net.conv1.weight.shape),) + shaped[1:2]
                + (layers.kernel_of(sums[2].reshape(32, -1), net.conv2.weight.shape),)
                + shaped[3:])

    def kernel_norms(self, grads, patches):
        """Each example's squared kernel gradient norm [B] from output gradients [B, P, O] and
        patches [B, P, K]."""
        # -> [B, P, P]
        grams = self.batch_matmul_tb(grads, grads) * self.batch_matmul_tb(patches, patches)
        return grams.reshape(grams.shape[0], -1).sum(1)

    def patch_product(self, grads, patches):
        """Σ over examples and positions of g_p a_pᵀ: [O, K]."""
        return self.matmul_ta(grads.reshape(-1, grads.shape[2]),
                              patches.reshape(-1, patches.shape[2]))


def build_network(network):
    """The network `network` (interface.Network) names: the ScatterNet CNN made by hand for
    MindSpore's CPU kernels, any other from its declaration (DeclaredNet)."""
    architecture = architectures.of(network)
    if architecture is architectures.of(Network("scattering", network.activation, "cnn")):
        return ScatterNetCNN(network.activation)
    return DeclaredNet(architecture, network.activation)

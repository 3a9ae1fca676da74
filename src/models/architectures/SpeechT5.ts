import { selfAttention, transformerBlock } from "../onnx/Attention.js"
import { cachedCrossAttention, freshEncoderStates, mergedDecoderCacheInputs } from "../onnx/MergedDecoderCache.js"
import { elementType, float, Graph, type Value } from "../onnx/Graph.js"
import { layerNorm, linear, matrixWeight, mlp } from "../onnx/Layers.js"
import type {
  AttentionWeights,
  LayerNormWeights,
  LinearWeights,
  Matrix,
  MlpWeights,
  TransformerBlockWeights
} from "../Weights.js"

/**
 * SpeechT5's text-to-speech graphs in the layout of the community's exports (Xenova/speecht5_tts,
 * and its vocoder Xenova/speecht5_hifigan), which transformers.js's SpeechT5ForTextToSpeech and
 * SpeechT5HifiGan load and `generate_speech` drives:
 *
 * - `encoder_model.onnx`: input_ids [batch, tokens] → encoder_outputs [batch, tokens, hidden] and
 *   encoder_attention_mask [batch, tokens] (all ones: the exporter's).
 * - `decoder_model_merged.onnx`: output_sequence [1, frames, mel bins] (the frames so far, a zero
 *   frame first), encoder_hidden_states, encoder_attention_mask, speaker_embeddings [1, speaker
 *   dim], use_cache_branch and past_key_values.{i}.{decoder,encoder}.{key,value} → output_sequence_out
 *   (the frames with this step's last one appended), spectrum [reduction factor, mel bins] (this
 *   step's frames), prob [reduction factor] (the stop probability) and present.*. As in optimum's
 *   export, the speech prenet reads every frame so far and the layers run on its last position;
 *   the rows of batch 0 alone are read out, so a run is one utterance.
 * - the vocoder's `model.onnx`: spectrogram [frames, mel bins] → waveform [frames × hop], HiFi-GAN:
 *   a convolution, transposed convolutions that upsample, multi-receptive-field residual blocks,
 *   tanh. transformers.js feeds it the decoder's spectra without the postnet, as the exports are.
 *
 * The blocks here are pre-norm and the encoder has no relative position bias (SpeechT5's are
 * post-norm, with one): a random model needs the exports' inputs, outputs and cache, which are
 * SpeechT5's. The merged decoder switches on use_cache_branch without an If node, as Whisper.ts's
 * does: the encoder states are sliced to nothing on cached steps and the computed keys appended to
 * the past ones.
 */

export interface SpeechT5Size {
  readonly hidden: number
  readonly heads: number
  readonly encoderLayers: number
  readonly decoderLayers: number
  readonly ffn: number
  readonly vocabSize: number
  readonly melBins: number
  /** Frames the decoder writes a step. */
  readonly reductionFactor: number
  readonly speakerDim: number
  readonly prenetUnits: number
  readonly prenetLayers: number
  readonly maxTextPositions: number
  readonly maxSpeechPositions: number
}

export interface SpeechT5DecoderLayer {
  readonly selfNorm: LayerNormWeights
  readonly self: AttentionWeights
  readonly crossNorm: LayerNormWeights
  readonly cross: AttentionWeights
  readonly mlpNorm: LayerNormWeights
  readonly mlp: MlpWeights
}

export interface SpeechT5Weights {
  /** [vocab, hidden]. */
  readonly embedTokens: Matrix
  /** Scales the sinusoidal positions added to the text and to the speech prenet (SpeechT5's alpha). */
  readonly textAlpha: number
  readonly speechAlpha: number
  readonly encoderLayers: ReadonlyArray<TransformerBlockWeights>
  readonly encoderNorm: LayerNormWeights
  /** mel bins → units → … → units, ReLU after each. */
  readonly prenet: ReadonlyArray<LinearWeights>
  /** units → hidden. */
  readonly prenetOut: LinearWeights
  /** hidden + speaker dim → hidden, ReLU: the speaker embedding (normalised) joins each frame. */
  readonly speakerProjection: LinearWeights
  readonly decoderLayers: ReadonlyArray<SpeechT5DecoderLayer>
  readonly decoderNorm: LayerNormWeights
  /** hidden → reduction factor × mel bins. */
  readonly featOut: LinearWeights
  /** hidden → reduction factor. */
  readonly probOut: LinearWeights
  /**
   * A random model's stop: the stop logit grows by `slope` a step and crosses 0 after
   * `stepsPerToken` steps per input token, as a trained model's ends after the text is spoken.
   */
  readonly stop: { readonly slope: number; readonly stepsPerToken: number }
}

/** SpeechT5's fixed positions: sines in the even features, cosines in the odd ones. */
export const interleavedSinusoids = (positions: number, width: number): Float32Array => {
  const out = new Float32Array(positions * width)
  for (let p = 0; p < positions; p++) {
    for (let i = 0; i < width; i += 2) {
      const angle = p * Math.exp((-i * Math.log(10000)) / width)
      out[p * width + i] = Math.sin(angle)
      if (i + 1 < width) out[p * width + i + 1] = Math.cos(angle)
    }
  }
  return out
}

const dim = (g: Graph, of: Value, axis: number) =>
  g.op("Gather", [g.op("Shape", [of]), g.int64Scalar(axis)], { axis: 0 })

/** x [batch, n, width] plus alpha × the positions 0 … n − 1. */
const addPositions = (g: Graph, x: Value, positions: number, width: number, alpha: number, from: Value) => {
  const table = g.weight("encode_positions.pe", "float32", [positions, width], interleavedSinusoids(positions, width))
  const rows = g.op("Range", [g.int64Scalar(0), dim(g, from, 1), g.int64Scalar(1)])
  return g.op("Add", [x, g.op("Mul", [g.op("Gather", [table, rows]), g.floatScalar(alpha)])])
}

export const speechT5EncoderGraph = (size: SpeechT5Size, w: SpeechT5Weights): Graph => {
  const g = new Graph("encoder_model")
  const inputIds = g.input("input_ids", "int64", ["batch_size", "encoder_sequence_length"])
  let x = g.scope("prenet", () => {
    const embedded = g.op("Gather", [matrixWeight(g, "embed_tokens.weight", w.embedTokens), inputIds])
    return addPositions(g, embedded, size.maxTextPositions, size.hidden, w.textAlpha, inputIds)
  })
  w.encoderLayers.forEach((layer, index) => {
    x = transformerBlock(g, x, layer, {}, `layers.${index}`).output
  })
  g.output(layerNorm(g, x, w.encoderNorm, "layer_norm"), "encoder_outputs", "float32", [
    "batch_size",
    "encoder_sequence_length",
    size.hidden
  ])
  const ones = g.op("Add", [g.op("Mul", [inputIds, g.int64Scalar(0)]), g.int64Scalar(1)])
  g.output(ones, "encoder_attention_mask", "int64", ["batch_size", "encoder_sequence_length"])
  return g
}

export const speechT5DecoderGraph = (size: SpeechT5Size, w: SpeechT5Weights): Graph => {
  const g = new Graph("decoder_model_merged")
  const headDim = size.hidden / size.heads
  const outputSequence = g.input("output_sequence", "float32", ["batch_size", "decoder_sequence_length", size.melBins])
  const encoderStates = g.input("encoder_hidden_states", "float32", [
    "batch_size",
    "encoder_sequence_length",
    size.hidden
  ])
  const encoderMask = g.input("encoder_attention_mask", "int64", ["batch_size", "encoder_sequence_length"])
  const speaker = g.input("speaker_embeddings", "float32", ["batch_size", size.speakerDim])
  const pasts = mergedDecoderCacheInputs(g, w.decoderLayers.length, size.heads, headDim)
  const useCache = g.input("use_cache_branch", "bool", [1])

  // The speech prenet over every frame so far; the layers take its last position.
  let x = g.scope("prenet", () => {
    let h = outputSequence
    w.prenet.forEach((layer, index) => {
      h = g.op("Relu", [linear(g, h, layer, `layers.${index}`)])
    })
    h = addPositions(
      g,
      linear(g, h, w.prenetOut, "final_layer"),
      size.maxSpeechPositions,
      size.hidden,
      w.speechAlpha,
      h
    )
    const squares = g.op("ReduceSum", [g.op("Mul", [speaker, speaker]), g.int64s([1])], { keepdims: 1 })
    const unit = g.op("Div", [speaker, g.op("Sqrt", [g.op("Max", [squares, g.floatScalar(1e-24)])])])
    const frames = g.op("Concat", [g.int64s([1]), g.op("Unsqueeze", [dim(g, h, 1), g.int64s([0])]), g.int64s([1])], {
      axis: 0
    })
    const spread = g.op("Tile", [g.op("Unsqueeze", [unit, g.int64s([1])]), frames])
    const joined = g.op("Relu", [
      linear(g, g.op("Concat", [h, spread], { axis: 2 }), w.speakerProjection, "speaker_embeds_layer")
    ])
    return g.op("Slice", [joined, g.int64s([-1]), g.int64s([2 ** 31]), g.int64s([1])])
  })

  const freshEncoder = freshEncoderStates(g, encoderStates, useCache)
  const crossMask = g.op("Unsqueeze", [g.op("Cast", [encoderMask], { to: elementType("bool") }), g.int64s([1, 2])])
  const cacheShape = (sequence: string) => ["batch_size", size.heads, sequence, headDim]
  w.decoderLayers.forEach((layer, index) => {
    const cache = pasts[index]!
    g.scope(`layers.${index}`, () => {
      const attended = selfAttention(
        g,
        layerNorm(g, x, layer.selfNorm, "self_attn_layer_norm"),
        layer.self,
        { past: { key: cache.decoderKey, value: cache.decoderValue } },
        "self_attn"
      )
      g.output(
        attended.present!.key,
        `present.${index}.decoder.key`,
        "float32",
        cacheShape("past_decoder_sequence_length + 1")
      )
      g.output(
        attended.present!.value,
        `present.${index}.decoder.value`,
        "float32",
        cacheShape("past_decoder_sequence_length + 1")
      )
      x = g.op("Add", [x, attended.output])
      const crossOut = g.scope("encoder_attn", () =>
        cachedCrossAttention(
          g,
          layerNorm(g, x, layer.crossNorm, "layer_norm"),
          layer.cross,
          cache,
          freshEncoder,
          index,
          crossMask
        )
      )
      x = g.op("Add", [x, crossOut])
      x = g.op("Add", [x, mlp(g, layerNorm(g, x, layer.mlpNorm, "final_layer_norm"), layer.mlp, "feed_forward")])
    })
  })
  // The last position of batch 0, [hidden], as the export reads it.
  const last = g.op("Reshape", [
    g.op("Slice", [layerNorm(g, x, w.decoderNorm, "layer_norm"), g.int64s([0]), g.int64s([1]), g.int64s([0])]),
    g.int64s([size.hidden])
  ])
  const spectrum = g.op("Reshape", [
    linear(g, last, w.featOut, "feat_out"),
    g.int64s([size.reductionFactor, size.melBins])
  ])
  // The random model's stop term: slope × (steps taken − stepsPerToken × tokens).
  const steps = g.op("Cast", [g.op("Add", [dim(g, pasts[0]!.decoderKey, 2), g.int64Scalar(1)])], {
    to: elementType("float32")
  })
  const tokens = g.op("Cast", [dim(g, encoderMask, 1)], { to: elementType("float32") })
  const stopTerm = g.op("Mul", [
    g.op("Sub", [steps, g.op("Mul", [tokens, g.floatScalar(w.stop.stepsPerToken)])]),
    g.floatScalar(w.stop.slope)
  ])
  const prob = g.op("Sigmoid", [g.op("Add", [linear(g, last, w.probOut, "prob_out"), stopTerm])])
  const lastFrame = g.op("Reshape", [
    g.op("Slice", [spectrum, g.int64s([-1]), g.int64s([2 ** 31]), g.int64s([0])]),
    g.int64s([1, 1, size.melBins])
  ])
  g.output(g.op("Concat", [outputSequence, lastFrame], { axis: 1 }), "output_sequence_out", "float32", [
    "batch_size",
    "decoder_sequence_length + 1",
    size.melBins
  ])
  g.output(spectrum, "spectrum", "float32", [size.reductionFactor, size.melBins])
  g.output(prob, "prob", "float32", [size.reductionFactor])
  return g
}

/** HiFi-GAN's hyperparameters, as SpeechT5HifiGanConfig names them. */
export interface HifiGanSize {
  readonly melBins: number
  readonly upsampleInitialChannel: number
  readonly upsampleRates: ReadonlyArray<number>
  readonly upsampleKernelSizes: ReadonlyArray<number>
  readonly resblockKernelSizes: ReadonlyArray<number>
  readonly resblockDilationSizes: ReadonlyArray<ReadonlyArray<number>>
  readonly leakyReluSlope: number
}

export interface Conv1dWeights {
  /** [out, in, kernel] (a Conv) or [in, out, kernel] (a ConvTranspose). */
  readonly kernel: Float32Array
  readonly bias: Float32Array
}

export interface HifiGanWeights {
  /** Subtracted from and divided into the spectrogram's bins (normalize_before). */
  readonly mean: Float32Array
  readonly scale: Float32Array
  readonly convPre: Conv1dWeights
  readonly upsamplers: ReadonlyArray<Conv1dWeights>
  /** Per upsampling stage, per resblock kernel size, per dilation: the dilated and the plain convolution. */
  readonly resblocks: ReadonlyArray<
    ReadonlyArray<ReadonlyArray<{ readonly dilated: Conv1dWeights; readonly plain: Conv1dWeights }>>
  >
  readonly convPost: Conv1dWeights
}

/** The samples HiFi-GAN writes per spectrogram frame. */
export const hifiGanHop = (size: Pick<HifiGanSize, "upsampleRates">): number =>
  size.upsampleRates.reduce((product, rate) => product * rate, 1)

/** Channels after upsampling stage `stage`: halved at each. */
export const hifiGanChannels = (size: HifiGanSize, stage: number): number =>
  Math.floor(size.upsampleInitialChannel / 2 ** (stage + 1))

/**
 * How many spectrogram frames on each side of a frame can change its samples: the receptive field
 * of the convolutions, in frames (each layer's reach at its own rate, divided by the samples per
 * frame at that rate), rounded up. A window that holds this many frames around a span computes
 * that span's samples as the whole spectrogram does.
 */
export const hifiGanContextFrames = (size: HifiGanSize): number => {
  let frames = 3 // conv_pre, kernel 7
  let rate = 1
  size.upsampleRates.forEach((upsample, stage) => {
    frames += Math.ceil(size.upsampleKernelSizes[stage]! / upsample) / rate
    rate *= upsample
    const widest = Math.max(
      ...size.resblockKernelSizes.map((kernel, k) =>
        size.resblockDilationSizes[k]!.reduce((sum, dilation) => sum + ((kernel - 1) / 2) * (dilation + 1), 0)
      )
    )
    frames += widest / rate
  })
  frames += 3 / rate // conv_post, kernel 7
  return Math.ceil(frames)
}

export const hifiGanGraph = (size: HifiGanSize, w: HifiGanWeights): Graph => {
  const g = new Graph("model")
  const spectrogram = g.input("spectrogram", "float32", ["sequence_length", size.melBins])
  const conv = (
    x: Value,
    weights: Conv1dWeights,
    inputs: number,
    outputs: number,
    kernel: number,
    dilation: number,
    name: string
  ) =>
    g.scope(name, () =>
      g.op(
        "Conv",
        [
          x,
          g.weight("weight", "float32", [outputs, inputs, kernel], weights.kernel),
          g.weight("bias", "float32", [outputs], weights.bias)
        ],
        {
          kernel_shape: [kernel],
          dilations: [dilation],
          pads: [((kernel - 1) / 2) * dilation, ((kernel - 1) / 2) * dilation]
        }
      )
    )
  const leaky = (x: Value, alpha: number) => g.op("LeakyRelu", [x], { alpha: float(alpha) })
  const normalized = g.op("Div", [
    g.op("Sub", [spectrogram, g.weight("mean", "float32", [size.melBins], w.mean)]),
    g.weight("scale", "float32", [size.melBins], w.scale)
  ])
  let x = conv(
    g.op("Transpose", [g.op("Unsqueeze", [normalized, g.int64s([0])])], { perm: [0, 2, 1] }),
    w.convPre,
    size.melBins,
    size.upsampleInitialChannel,
    7,
    1,
    "conv_pre"
  )
  size.upsampleRates.forEach((rate, stage) => {
    const inputs = stage === 0 ? size.upsampleInitialChannel : hifiGanChannels(size, stage - 1)
    const channels = hifiGanChannels(size, stage)
    const kernel = size.upsampleKernelSizes[stage]!
    x = g.scope(`upsampler.${stage}`, () =>
      g.op(
        "ConvTranspose",
        [
          leaky(x, size.leakyReluSlope),
          g.weight("weight", "float32", [inputs, channels, kernel], w.upsamplers[stage]!.kernel),
          g.weight("bias", "float32", [channels], w.upsamplers[stage]!.bias)
        ],
        { kernel_shape: [kernel], strides: [rate], pads: [(kernel - rate) / 2, (kernel - rate) / 2] }
      )
    )
    const upsampled = x
    const blocks = size.resblockKernelSizes.map((kernelSize, k) =>
      g.scope(`resblocks.${stage * size.resblockKernelSizes.length + k}`, () => {
        let r = upsampled
        size.resblockDilationSizes[k]!.forEach((dilation, d) => {
          const pair = w.resblocks[stage]![k]![d]!
          const dilated = conv(
            leaky(r, size.leakyReluSlope),
            pair.dilated,
            channels,
            channels,
            kernelSize,
            dilation,
            `convs1.${d}`
          )
          const plain = conv(
            leaky(dilated, size.leakyReluSlope),
            pair.plain,
            channels,
            channels,
            kernelSize,
            1,
            `convs2.${d}`
          )
          r = g.op("Add", [plain, r])
        })
        return r
      })
    )
    const sum = blocks.slice(1).reduce((total, block) => g.op("Add", [total, block]), blocks[0]!)
    x = g.op("Div", [sum, g.floatScalar(blocks.length)])
  })
  const last = hifiGanChannels(size, size.upsampleRates.length - 1)
  const waveform = g.op("Tanh", [conv(leaky(x, 0.01), w.convPost, last, 1, 7, 1, "conv_post")])
  g.output(g.op("Reshape", [waveform, g.int64s([-1])]), "waveform", "float32", ["num_samples"])
  return g
}

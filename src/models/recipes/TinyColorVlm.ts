import { decoderGraph, embedTokensGraph } from "../architectures/Decoder.js"
import { Graph, type Value } from "../onnx/Graph.js"
import { gelu, linear, matrixWeight, patchEmbedding } from "../onnx/Layers.js"
import { Random } from "../Random.js"
import {
  type DecoderWeights,
  type LayerNormWeights,
  type LinearWeights,
  type Matrix,
  matrix,
  type PatchEmbeddingWeights,
  type TransformerBlockWeights
} from "../Weights.js"
import { answerWords, chatVocabulary, colorWordVariants, specialTokens, tokenizerConfig } from "./ChatVocabulary.js"
import {
  channel,
  colorBits,
  colors,
  hiddenSize,
  positionPairs,
  readChannel,
  setMirrored,
  writeChannel
} from "./ColorChannels.js"
import { jsonFile, type ModelRecipe, recipeStamp } from "./Recipe.js"

/**
 * cornserve/tiny-color-vlm: a vision-and-audio language model whose weights are set by formula so
 * that its answers can be checked. Asked about an image, greedy decoding says the image's dominant
 * colour (one of eight) and then <|im_end|>; asked about a sound, it says "low" or "high"; with
 * neither, "nothing". The channel layout it computes in is described in ColorChannels.ts.
 *
 * - vision_encoder.onnx: per 8×8 patch and colour channel, a Conv patch embedding gives z ± 1 where
 *   z = 15 × the patch's mean (pixel_values are normalized to [-1, 1], so z = 0 at half intensity).
 *   A GELU and a linear projector form GELU(z + 1) − GELU(z − 1) − 1, a smooth sign: one vote per
 *   patch and channel, +1 when bright and −1 when dark. A norm completion then pads every row to
 *   the same length, so that attention, after its LayerNorm, weighs all patches alike.
 * - audio_encoder.onnx: 25 ms frames of 16 kHz PCM go through a Hann-windowed DFT (two MatMuls);
 *   band power above and below 500 Hz gives (high − low)/(high + low) per frame.
 * - decoder_model_merged.onnx (2 layers, learned positions, KV cache): in layer 0, head 0's query
 *   is a constant bias and its key reads the image flag, so every position attends uniformly to
 *   the image rows and averages their votes (a per-channel majority vote over patches); head 1
 *   does the same for audio frames. Layer 0's MLP saturates the averaged votes to ±1. Layer 1 has
 *   small seeded random weights: a generic layer the answer must survive. The LM head scores each
 *   colour word by how well the decided bits match it, "low"/"high" by the pitch decision, and
 *   <|im_end|> by the answer flag of the current token, so the turn ends right after the answer.
 */

const name = "cornserve/tiny-color-vlm"
const version = 1

export const imageSize = 64
const patchSize = 8
const imageSeqLength = (imageSize / patchSize) ** 2
export const samplingRate = 16_000
const clipSamples = 16_000
const frameLength = 400
const audioSeqLength = clipSamples / frameLength
const lowBandLimitHz = 500

const decoderLayers = 2
const heads = 4
const headDim = hiddenSize / heads
const intermediateSize = 2 * hiddenSize
const maxPositions = 1024
const layerNormEpsilon = 1e-5

/** The value of the image/audio flag on feature rows. */
const featureFlag = 2
/** Every image and audio feature row is padded to this squared norm: the flag and room for three votes (each ≤ 1.05), mirrored. */
const featureNormSquared = 2 * featureFlag ** 2 + 2 * 4
/** How sharply a patch's mean colour turns into a vote, in units of normalized intensity. */
const patchVoteGain = 15
/** How sharply the decoder turns an averaged vote into a decision. */
const decisionGain = 30
/** Attention score of a feature row for the head that gathers its modality (others score 0). */
const gatherScore = 24

/** Pads each row of x [..., hidden] to squared norm `normSquared` with a mirrored channel pair. */
export interface NormCompletion {
  readonly channel: number
  readonly normSquared: number
}

export interface ColorVisionWeights {
  readonly imageSize: number
  readonly patch: PatchEmbeddingWeights
  readonly projector: LinearWeights
  readonly completion: NormCompletion
}

export interface PitchAudioWeights {
  readonly clipSamples: number
  readonly frameLength: number
  /** [frameLength, bins]: Hann window × cos / sin of each DFT bin. */
  readonly cosine: Matrix
  readonly sine: Matrix
  /** [bins, 2]: column 0 sums high-band power minus low-band power, column 1 all power. */
  readonly bands: Matrix
  readonly epsilon: number
  /** [1, hidden]: the pitch ratio into its channel, plus the audio flag as bias. */
  readonly projector: LinearWeights
  readonly completion: NormCompletion
}

const mirroredVector = (entries: ReadonlyArray<readonly [number, number]>): Float32Array => {
  const v = new Float32Array(hiddenSize)
  for (const [c, value] of entries) setMirrored(v, c, value)
  return v
}

export const colorVisionWeights = (): ColorVisionWeights => {
  const pixelsPerPatch = patchSize * patchSize
  const kernel = new Float32Array(6 * 3 * pixelsPerPatch)
  const patchBias = new Float32Array(6)
  for (let rgb = 0; rgb < 3; rgb++) {
    for (const [unit, offset] of [
      [2 * rgb, 1],
      [2 * rgb + 1, -1]
    ] as const) {
      kernel.fill(
        patchVoteGain / pixelsPerPatch,
        (unit * 3 + rgb) * pixelsPerPatch,
        (unit * 3 + rgb + 1) * pixelsPerPatch
      )
      patchBias[unit] = offset
    }
  }
  const projector = matrix(6, hiddenSize)
  for (let rgb = 0; rgb < 3; rgb++) {
    writeChannel(projector, 2 * rgb, channel.imageBits + rgb, 1)
    writeChannel(projector, 2 * rgb + 1, channel.imageBits + rgb, -1)
  }
  const bias = mirroredVector([
    [channel.image, featureFlag],
    [channel.imageBits, -1],
    [channel.imageBits + 1, -1],
    [channel.imageBits + 2, -1]
  ])
  return {
    imageSize,
    patch: { channels: 3, hidden: 6, patchSize, kernel, bias: patchBias },
    projector: { weight: projector, bias },
    completion: { channel: channel.imageCompletion, normSquared: featureNormSquared }
  }
}

export const pitchAudioWeights = (): PitchAudioWeights => {
  const bins = frameLength / 2 - 1
  const cosine = matrix(frameLength, bins)
  const sine = matrix(frameLength, bins)
  for (let n = 0; n < frameLength; n++) {
    const hann = 0.5 - 0.5 * Math.cos((2 * Math.PI * n) / frameLength)
    for (let k = 1; k <= bins; k++) {
      const angle = (2 * Math.PI * k * n) / frameLength
      cosine.data[n * bins + k - 1] = hann * Math.cos(angle)
      sine.data[n * bins + k - 1] = hann * Math.sin(angle)
    }
  }
  const bands = matrix(bins, 2)
  for (let k = 1; k <= bins; k++) {
    const high = (k * samplingRate) / frameLength >= lowBandLimitHz
    bands.data[(k - 1) * 2] = high ? 1 : -1
    bands.data[(k - 1) * 2 + 1] = 1
  }
  const projector = matrix(1, hiddenSize)
  writeChannel(projector, 0, channel.pitch, 1)
  return {
    clipSamples,
    frameLength,
    cosine,
    sine,
    bands,
    epsilon: 1e-6,
    projector: { weight: projector, bias: mirroredVector([[channel.audio, featureFlag]]) },
    completion: { channel: channel.pitchCompletion, normSquared: featureNormSquared }
  }
}

const normCompletion = (g: Graph, rows: Value, completion: NormCompletion): Value =>
  g.scope("norm_completion", () => {
    const squared = g.op("ReduceSumSquare", [rows], { axes: [-1], keepdims: 1 })
    const missing = g.op("Relu", [g.op("Sub", [g.floatScalar(completion.normSquared), squared])])
    const amount = g.op("Sqrt", [g.op("Mul", [missing, g.floatScalar(0.5)])])
    const direction = g.weight("direction", "float32", [hiddenSize], mirroredVector([[completion.channel, 1]]))
    return g.op("Add", [rows, g.op("Mul", [amount, direction])])
  })

const colorVisionGraph = (w: ColorVisionWeights): Graph => {
  const g = new Graph("vision_encoder")
  const pixels = g.input("pixel_values", "float32", ["batch_size", 3, w.imageSize, w.imageSize])
  const votes = gelu(g, patchEmbedding(g, pixels, w.patch, "patch_embedding"))
  const features = normCompletion(g, linear(g, votes, w.projector, "projector"), w.completion)
  g.output(features, "image_features", "float32", ["batch_size", (w.imageSize / w.patch.patchSize) ** 2, hiddenSize])
  return g
}

const pitchAudioGraph = (w: PitchAudioWeights): Graph => {
  const frames = w.clipSamples / w.frameLength
  const g = new Graph("audio_encoder")
  const samples = g.input("input_values", "float32", ["batch_size", w.clipSamples])
  const framed = g.op("Reshape", [samples, g.int64s([0, frames, w.frameLength])])
  const square = (v: Value) => g.op("Mul", [v, v])
  const real = g.op("MatMul", [framed, matrixWeight(g, "dft.cosine", w.cosine)])
  const imaginary = g.op("MatMul", [framed, matrixWeight(g, "dft.sine", w.sine)])
  const power = g.op("Add", [square(real), square(imaginary)])
  const bands = g.op("MatMul", [power, matrixWeight(g, "bands", w.bands)])
  const column = (index: number) => g.op("Slice", [bands, g.int64s([index]), g.int64s([index + 1]), g.int64s([-1])])
  const ratio = g.op("Div", [column(0), g.op("Add", [column(1), g.floatScalar(w.epsilon)])])
  const features = normCompletion(g, linear(g, ratio, w.projector, "projector"), w.completion)
  g.output(features, "audio_features", "float32", ["batch_size", frames, hiddenSize])
  return g
}

const identityNorm = (): LayerNormWeights => ({
  gamma: new Float32Array(hiddenSize).fill(1),
  beta: new Float32Array(hiddenSize),
  epsilon: layerNormEpsilon
})

const linearOf = (rows: number, cols: number): { weight: Matrix; bias: Float32Array } => ({
  weight: matrix(rows, cols),
  bias: new Float32Array(cols)
})

/**
 * The factor a LayerNorm divides a feature row by: feature rows have squared norm
 * featureNormSquared, position rows 2 × positionPairs, in orthogonal channels, and mean 0.
 */
const featureRowScale = Math.sqrt((featureNormSquared + 2 * positionPairs) / hiddenSize + layerNormEpsilon)

const gatherLayer = (): TransformerBlockWeights => {
  const query = linearOf(hiddenSize, hiddenSize)
  const key = linearOf(hiddenSize, hiddenSize)
  const value = linearOf(hiddenSize, hiddenSize)
  const output = linearOf(hiddenSize, hiddenSize)
  const gathers = [
    {
      head: 0,
      flag: channel.image,
      present: channel.imagePresent,
      values: [0, 1, 2].map((i) => [channel.imageBits + i, channel.pooledBits + i] as const)
    },
    {
      head: 1,
      flag: channel.audio,
      present: channel.audioPresent,
      values: [[channel.pitch, channel.pooledPitch] as const]
    }
  ]
  for (const gather of gathers) {
    const base = gather.head * headDim
    // The query is the same at every position, so the score only depends on the key's flag.
    query.bias[base] = (gatherScore * Math.sqrt(headDim) * featureRowScale) / featureFlag
    readChannel(key.weight, gather.flag, base, 1)
    readChannel(value.weight, gather.flag, base, 1)
    writeChannel(output.weight, base, gather.present, featureRowScale / featureFlag)
    gather.values.forEach(([from, to], i) => {
      readChannel(value.weight, from, base + 1 + i, 1)
      writeChannel(output.weight, base + 1 + i, to, featureRowScale)
    })
  }
  const up = linearOf(hiddenSize, intermediateSize)
  const down = linearOf(intermediateSize, hiddenSize)
  const decisions = [
    ...[0, 1, 2].map((i) => [channel.pooledBits + i, channel.colorDecision + i] as const),
    [channel.pooledPitch, channel.pitchDecision] as const
  ]
  decisions.forEach(([from, to], i) => {
    // GELU(z + 1) − GELU(z − 1) − 1 is 0 at z = 0 and tends to ±1: a smooth sign.
    for (const [unit, offset] of [
      [2 * i, 1],
      [2 * i + 1, -1]
    ] as const) {
      readChannel(up.weight, from, unit, decisionGain)
      up.bias[unit] = offset
      writeChannel(down.weight, unit, to, offset)
    }
    setMirrored(down.bias, to, -1)
  })
  return {
    norm1: identityNorm(),
    attention: { heads, query, key, value, output },
    norm2: identityNorm(),
    mlp: { up, down }
  }
}

/** A generic layer with small random weights; its writes are mirrored so rows keep mean 0. */
const randomLayer = (random: Random): TransformerBlockWeights => {
  const std = 0.01
  const randomMatrix = (rows: number, cols: number) => matrix(rows, cols, random.normals(rows * cols, std))
  const mirroredWrites = (rows: number) => {
    const m = matrix(rows, hiddenSize)
    for (let r = 0; r < rows; r++) {
      for (let c = 0; c < hiddenSize / 2; c++) writeChannel(m, r, c, random.normal() * std)
    }
    return m
  }
  return {
    norm1: identityNorm(),
    attention: {
      heads,
      query: { weight: randomMatrix(hiddenSize, hiddenSize) },
      key: { weight: randomMatrix(hiddenSize, hiddenSize) },
      value: { weight: randomMatrix(hiddenSize, hiddenSize) },
      output: { weight: mirroredWrites(hiddenSize) }
    },
    norm2: identityNorm(),
    mlp: {
      up: { weight: randomMatrix(hiddenSize, intermediateSize) },
      down: { weight: mirroredWrites(intermediateSize) }
    }
  }
}

/** LM-head gains. With an image, the true colour scores 3·color + imagePresent and the nearest wrong one color + imagePresent. */
const gain = {
  color: 10,
  imagePresent: 5,
  pitch: 10,
  audioPresent: 60,
  audioOverImage: 40,
  nothing: 5,
  mediaOverNothing: 50,
  endOfTurn: 100
}

export const colorDecoderWeights = (vocabulary = chatVocabulary()): DecoderWeights => {
  const vocab = vocabulary.vocabSize
  const embedTokens = matrix(vocab, hiddenSize)
  for (let id = 0; id < vocab; id++) setMirrored(embedTokens.data, channel.text, 1, id * hiddenSize)
  for (const word of answerWords)
    setMirrored(embedTokens.data, channel.answer, 1, vocabulary.tokenId(word) * hiddenSize)
  for (const color of colors) {
    const bits = colorBits(color)
    for (const variant of colorWordVariants(color.name)) {
      const row = vocabulary.tokenId(variant) * hiddenSize
      setMirrored(embedTokens.data, channel.colorWord, 1, row)
      bits.forEach((bit, i) => setMirrored(embedTokens.data, channel.wordBits + i, bit, row))
    }
  }

  const positions = matrix(maxPositions, hiddenSize)
  for (let p = 0; p < maxPositions; p++) {
    for (let i = 0; i < positionPairs; i++) {
      const angle = p / 10 ** i
      setMirrored(positions.data, channel.position + 2 * i, Math.cos(angle), p * hiddenSize)
      setMirrored(positions.data, channel.position + 2 * i + 1, Math.sin(angle), p * hiddenSize)
    }
  }

  const lmHead = matrix(hiddenSize, vocab)
  const score = (word: string, reads: ReadonlyArray<readonly [number, number]>) => {
    const id = vocabulary.tokenId(word)
    for (const [c, weight] of reads) readChannel(lmHead, c, id, weight)
  }
  const noAnswerTwice = [channel.answer, -gain.endOfTurn] as const
  for (const color of colors) {
    score(color.name, [
      ...colorBits(color).map((bit, i) => [channel.colorDecision + i, gain.color * bit] as const),
      [channel.imagePresent, gain.imagePresent],
      [channel.audioPresent, -gain.audioOverImage],
      noAnswerTwice
    ])
  }
  score("low", [[channel.pitchDecision, -gain.pitch], [channel.audioPresent, gain.audioPresent], noAnswerTwice])
  score("high", [[channel.pitchDecision, gain.pitch], [channel.audioPresent, gain.audioPresent], noAnswerTwice])
  score("nothing", [
    [channel.text, gain.nothing],
    [channel.imagePresent, -gain.mediaOverNothing],
    [channel.audioPresent, -gain.mediaOverNothing],
    noAnswerTwice
  ])
  score(specialTokens.imEnd, [[channel.answer, gain.endOfTurn]])

  const random = new Random(0x5eed)
  return {
    embedTokens,
    positions,
    layers: [gatherLayer(), ...Array.from({ length: decoderLayers - 1 }, () => randomLayer(random))],
    finalNorm: identityNorm(),
    lmHead
  }
}

const build = () => {
  const vocabulary = chatVocabulary()
  const token = vocabulary.tokenId
  const config = {
    architectures: ["CornserveColorVlm"],
    model_type: "cornserve_color_vlm",
    cornserve: recipeStamp({ name, version }),
    text_config: {
      model_type: "cornserve_decoder",
      hidden_size: hiddenSize,
      intermediate_size: intermediateSize,
      num_hidden_layers: decoderLayers,
      num_attention_heads: heads,
      num_key_value_heads: heads,
      head_dim: headDim,
      vocab_size: vocabulary.vocabSize,
      max_position_embeddings: maxPositions,
      layer_norm_eps: layerNormEpsilon,
      hidden_act: "gelu"
    },
    vision_config: { image_size: imageSize, patch_size: patchSize, num_channels: 3 },
    audio_config: { sampling_rate: samplingRate, num_samples: clipSamples, frame_length: frameLength },
    image_token_id: token(specialTokens.image),
    image_seq_length: imageSeqLength,
    audio_token_id: token(specialTokens.audio),
    audio_seq_length: audioSeqLength,
    eos_token_id: token(specialTokens.imEnd),
    pad_token_id: token(specialTokens.endOfText),
    torch_dtype: "float32"
  }
  const preprocessor = {
    image_processor_type: "CornserveImageProcessor",
    do_resize: true,
    size: { height: imageSize, width: imageSize },
    resample: 2,
    do_rescale: true,
    rescale_factor: 1 / 255,
    do_normalize: true,
    image_mean: [0.5, 0.5, 0.5],
    image_std: [0.5, 0.5, 0.5],
    feature_extractor_type: "CornserveRawAudioFeatureExtractor",
    sampling_rate: samplingRate,
    n_samples: clipSamples
  }
  const decoder = colorDecoderWeights(vocabulary)
  return new Map([
    ["config.json", jsonFile(config)],
    [
      "generation_config.json",
      jsonFile({
        eos_token_id: config.eos_token_id,
        pad_token_id: config.pad_token_id,
        do_sample: false,
        max_new_tokens: 16
      })
    ],
    ["preprocessor_config.json", jsonFile(preprocessor)],
    ["tokenizer.json", jsonFile(vocabulary.tokenizerJson)],
    ["tokenizer_config.json", jsonFile(tokenizerConfig(vocabulary, maxPositions))],
    ["onnx/vision_encoder.onnx", colorVisionGraph(colorVisionWeights()).toBytes()],
    ["onnx/audio_encoder.onnx", pitchAudioGraph(pitchAudioWeights()).toBytes()],
    ["onnx/embed_tokens.onnx", embedTokensGraph(decoder).toBytes()],
    ["onnx/decoder_model_merged.onnx", decoderGraph(decoder).toBytes()]
  ])
}

export const tinyColorVlm: ModelRecipe = { name, version, build }

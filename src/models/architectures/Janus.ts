import { Graph, type Value } from "../onnx/Graph.js"
import { gelu, linear } from "../onnx/Layers.js"
import { Random } from "../Random.js"
import { type LinearWeights, matrix } from "../Weights.js"
import { type LlamaConfig, llamaGraphs } from "./Llama.js"

/**
 * DeepSeek's Janus-Pro (model_type "multi_modality") as the six graphs of the community's export
 * onnx-community/Janus-Pro-1B-ONNX, which transformers.js's MultiModalityCausalLM loads from onnx/
 * and drives with `generate` (text) and `generate_images` (image tokens, then pixels):
 *
 * - `prepare_inputs_embeds.onnx`: input_ids int64 [batch, sequence], pixel_values float32 [batch,
 *   images, 3, 384, 384] (images may be 0), images_seq_mask bool [batch, sequence] (the prompt's
 *   image placeholder positions), images_emb_mask bool [batch, images, image tokens] → inputs_embeds
 *   float32 [batch, sequence, hidden]: the text embeddings with the image features written at the
 *   placeholders (Janus's `inputs_embeds[images_seq_mask] = images_embeds[images_emb_mask]`).
 *   transformers.js runs it with masks whose batch differs from input_ids' (the guidance rows are
 *   added to input_ids only) and with an empty [0, 0, 3, 384, 384] pixel_values, so the merge is a
 *   scatter at the mask's true positions that works for any batch and for no image at all.
 * - `language_model.onnx`: inputs_embeds, attention_mask int64 [batch, total], position_ids int64
 *   [batch, sequence], past_key_values.N.key/value float32 [batch, kv heads, past, head dim] →
 *   last_hidden_state float32 [batch, sequence, hidden] (after the final norm, no head) and
 *   present.N.key/value. This is Llama.ts's split-layout decoder; transformers.js pairs it with a
 *   head by name (`pick(output, head.inputNames)`), so both heads take `last_hidden_state`.
 *   transformers.js does not pin that name; it is the one optimum gives a headless decoder, which
 *   we assume the export kept. Under classifier-free guidance the unconditional row's prompt is
 *   all padding with an attention mask of zeros (Janus keeps its first and last tokens; transformers.js
 *   masks them all), so its first step sees no key: masked scores are replaced by a finite one, and
 *   that row attends uniformly instead of turning to NaN.
 * - `lm_head.onnx`: last_hidden_state → logits float32 [batch, sequence, vocabulary].
 * - `gen_head.onnx`: last_hidden_state → logits float32 [batch, sequence, codebook]: Janus's
 *   vision_head (Linear, GELU, Linear) choosing the next image token.
 * - `gen_img_embeds.onnx`: image_ids int64 [batch, sequence] → inputs_embeds: the generation
 *   embedding (gen_embed, codebook × 8 in Janus) through the gen_aligner MLP (Linear, GELU, Linear).
 * - `image_decode.onnx`: generated_tokens int64 [batch, image tokens] → decoded_image float32
 *   [batch, 3, side, side] in [-1, 1]: the VQ-16 decoder, from the l2-normalized codebook entries
 *   laid on the square grid of tokens (24 × 24 in Janus), doubled `upsamplings` times (4 in Janus:
 *   384 pixels).
 *
 * The internals are simplified where only shapes and semantics matter to a random model: the
 * understanding encoder (SigLIP-L in Janus) is a projection of each patch pooled to 4 × 4 cells,
 * and the VQ decoder is convolutions with nearest upsampling (no residual blocks, no group norm,
 * a tanh to keep pixels in range). Everything is float32.
 */

/** The side of the images the understanding path reads; transformers.js builds its empty pixel_values at 384. */
export const janusImageSize = 384

/** Cells a side of each patch is pooled to before the vision projection. */
const poolCells = 4

export interface JanusConfig {
  readonly language: LlamaConfig
  /** Width of the understanding encoder's features before the aligner (1024 in Janus: SigLIP-L). */
  readonly visionHidden: number
  /** Image tokens the generation head chooses among (image_token_size, 16384 in Janus). */
  readonly codebookSize: number
  /** Width of a codebook entry and of the generation embedding (8 in Janus). */
  readonly codebookDim: number
  /** Image tokens per image, a square number (576 = 24² in Janus). */
  readonly imageTokens: number
  /** How many times the VQ decoder doubles the token grid (4 in Janus: 24 → 384 pixels). */
  readonly upsamplings: number
  /** Channels of the VQ decoder's convolutions. */
  readonly decoderChannels: number
}

/** Tokens along a side of the image's grid. */
export const janusGridSide = (config: JanusConfig): number => {
  const side = Math.round(Math.sqrt(config.imageTokens))
  if (side * side !== config.imageTokens) throw new Error(`${config.imageTokens} image tokens are not a square grid`)
  return side
}

/** The side of the decoded images in pixels. */
export const janusImageSide = (config: JanusConfig): number => janusGridSide(config) * 2 ** config.upsamplings

const randomLinear = (random: Random, inputs: number, outputs: number, std: number, bias: boolean): LinearWeights => ({
  weight: matrix(inputs, outputs, random.normals(inputs * outputs, std)),
  ...(bias ? { bias: random.normals(outputs, std / 4) } : {})
})

/** Janus's MlpProjector with depth 2 and GELU (`layers.0`, `layers.2`), the aligners of both paths. */
const aligner = (g: Graph, x: Value, random: Random, inputs: number, hidden: number, name: string): Value =>
  g.scope(name, () => {
    const first = linear(g, x, randomLinear(random, inputs, hidden, 1 / Math.sqrt(inputs), true), "layers.0")
    return linear(g, gelu(g, first), randomLinear(random, hidden, hidden, 1 / Math.sqrt(hidden), true), "layers.2")
  })

const prepareInputsEmbedsGraph = (config: JanusConfig, random: Random): Graph => {
  const g = new Graph("prepare_inputs_embeds")
  const hidden = config.language.hiddenSize
  const side = janusGridSide(config)
  const patch = janusImageSize / side
  if (!Number.isInteger(patch / poolCells)) {
    throw new Error(`patches of ${patch} pixels do not pool to ${poolCells} cells a side`)
  }
  const inputIds = g.input("input_ids", "int64", ["batch_size", "sequence_length"])
  const pixelValues = g.input("pixel_values", "float32", [
    "batch_size",
    "num_images",
    3,
    janusImageSize,
    janusImageSize
  ])
  const imagesSeqMask = g.input("images_seq_mask", "bool", ["batch_size", "sequence_length"])
  const imagesEmbMask = g.input("images_emb_mask", "bool", ["batch_size", "num_images", "num_image_tokens"])

  const table = g.weight(
    "language_model.model.embed_tokens.weight",
    "float32",
    [config.language.vocabSize, hidden],
    random.normals(config.language.vocabSize * hidden, 1)
  )
  const textEmbeds = g.op("Gather", [table, inputIds], { axis: 0 })

  // Each patch pooled to cells × cells colours: [images, side, side, 3 · cells²], one row per image token.
  const cellPixels = patch / poolCells
  const pooled = g.op(
    "ReduceMean",
    [g.op("Reshape", [pixelValues, g.int64s([-1, 3, side, poolCells, cellPixels, side, poolCells, cellPixels])])],
    { axes: [4, 7], keepdims: 0 }
  )
  const cellFeatures = 3 * poolCells * poolCells
  const patches = g.op("Reshape", [
    g.op("Transpose", [pooled], { perm: [0, 2, 4, 1, 3, 5] }),
    g.int64s([-1, config.imageTokens, cellFeatures])
  ])
  const visionFeatures = g.scope("vision_model", () =>
    gelu(
      g,
      linear(
        g,
        patches,
        randomLinear(random, cellFeatures, config.visionHidden, 1 / Math.sqrt(cellFeatures), true),
        "patch_proj"
      )
    )
  )
  const imageEmbeds = aligner(g, visionFeatures, random, config.visionHidden, hidden, "aligner")

  // Janus's inputs_embeds[images_seq_mask] = images_embeds[images_emb_mask], in row-major order on both sides.
  const selected = g.op(
    "Compress",
    [g.op("Reshape", [imageEmbeds, g.int64s([-1, hidden])]), g.op("Reshape", [imagesEmbMask, g.int64s([-1])])],
    { axis: 0 }
  )
  const placeholders = g.op("Transpose", [g.op("NonZero", [imagesSeqMask])], { perm: [1, 0] })
  const merged = g.op("ScatterND", [textEmbeds, placeholders, selected])
  g.output(merged, "inputs_embeds", "float32", ["batch_size", "sequence_length", hidden])
  return g
}

/**
 * The language model's weight scale. At 0.1 (RandomLlama's) the last prompt position barely looks
 * back, so prompts that differ in a word start their images alike and greedy decoding falls into
 * one repeated token; at 0.2 the image tokens vary and follow the prompt from the first.
 */
const languageStd = 0.2

const languageModelGraph = (config: JanusConfig, seed: number): Graph => {
  const graphs = llamaGraphs(
    config.language,
    {
      layout: "split",
      dtype: "fp32",
      positionIds: true,
      pastPrefix: "past_key_values",
      seed,
      std: languageStd,
      output: "last_hidden_state"
    },
    (name) => new Graph(name === "decoder_model_merged" ? "language_model" : name)
  )
  return graphs.get("decoder_model_merged")!
}

const hiddenStateInput = (g: Graph, config: JanusConfig): Value =>
  g.input("last_hidden_state", "float32", ["batch_size", "sequence_length", config.language.hiddenSize])

const lmHeadGraph = (config: JanusConfig, random: Random): Graph => {
  const g = new Graph("lm_head")
  const { hiddenSize: hidden, vocabSize } = config.language
  // Logits spread by ~2 so that greedy choices are not near ties.
  const head = randomLinear(random, hidden, vocabSize, 2 / Math.sqrt(hidden), false)
  const logits = linear(g, hiddenStateInput(g, config), head, "language_model.lm_head")
  g.output(logits, "logits", "float32", ["batch_size", "sequence_length", vocabSize])
  return g
}

const genHeadGraph = (config: JanusConfig, random: Random): Graph => {
  const g = new Graph("gen_head")
  const hidden = config.language.hiddenSize
  const logits = g.scope("gen_head", () => {
    const projected = linear(
      g,
      hiddenStateInput(g, config),
      randomLinear(random, hidden, hidden, 1 / Math.sqrt(hidden), true),
      "output_mlp_projector"
    )
    // Spread like the text head's: the guided difference of two rows must pick distinct tokens.
    const head = randomLinear(random, hidden, config.codebookSize, 2 / Math.sqrt(hidden), true)
    return linear(g, gelu(g, projected), head, "vision_head")
  })
  g.output(logits, "logits", "float32", ["batch_size", "sequence_length", config.codebookSize])
  return g
}

const genImgEmbedsGraph = (config: JanusConfig, random: Random): Graph => {
  const g = new Graph("gen_img_embeds")
  const hidden = config.language.hiddenSize
  const imageIds = g.input("image_ids", "int64", ["batch_size", "sequence_length"])
  const table = g.weight(
    "gen_embed.weight",
    "float32",
    [config.codebookSize, config.codebookDim],
    random.normals(config.codebookSize * config.codebookDim, 1)
  )
  const embeds = g.op("Gather", [table, imageIds], { axis: 0 })
  const aligned = aligner(g, embeds, random, config.codebookDim, hidden, "gen_aligner")
  g.output(aligned, "inputs_embeds", "float32", ["batch_size", "sequence_length", hidden])
  return g
}

/** A convolution with "same" padding; weights [out, in, k, k] with standard deviation `std`. */
const conv = (
  g: Graph,
  x: Value,
  random: Random,
  inputs: number,
  outputs: number,
  kernel: number,
  std: number,
  name: string
) =>
  g.scope(name, () => {
    const weight = g.weight(
      "weight",
      "float32",
      [outputs, inputs, kernel, kernel],
      random.normals(outputs * inputs * kernel * kernel, std)
    )
    const bias = g.weight("bias", "float32", [outputs], new Float32Array(outputs))
    const pad = (kernel - 1) / 2
    return g.op("Conv", [x, weight, bias], { kernel_shape: [kernel, kernel], pads: [pad, pad, pad, pad] })
  })

const silu = (g: Graph, x: Value): Value => g.op("Mul", [x, g.op("Sigmoid", [x])])

const imageDecodeGraph = (config: JanusConfig, random: Random): Graph => {
  const g = new Graph("image_decode")
  const side = janusGridSide(config)
  const pixels = janusImageSide(config)
  const channels = config.decoderChannels
  const tokens = g.input("generated_tokens", "int64", ["batch_size", config.imageTokens])
  const image = g.scope("gen_vision_model", () => {
    const codebook = g.weight(
      "quantize.embedding.weight",
      "float32",
      [config.codebookSize, config.codebookDim],
      random.normals(config.codebookSize * config.codebookDim, 1)
    )
    // VQ-16 keeps its codebook l2-normalized: each entry is a unit vector.
    const entries = g.op("Gather", [codebook, tokens], { axis: 0 })
    const unit = g.op("Div", [entries, g.op("ReduceL2", [entries], { axes: [-1], keepdims: 1 })])
    const grid = g.op("Reshape", [
      g.op("Transpose", [unit], { perm: [0, 2, 1] }),
      g.int64s([0, config.codebookDim, side, side])
    ])
    // Unit entries have components of variance 1/codebookDim, so unit-std weights keep unit variance.
    let x = conv(g, grid, random, config.codebookDim, channels, 1, 1, "post_quant_conv")
    x = conv(g, x, random, channels, channels, 3, Math.sqrt(1 / (9 * channels)), "decoder.conv_in")
    for (let stage = 0; stage < config.upsamplings; stage++) {
      g.scope(`decoder.conv_blocks.${stage}`, () => {
        const doubled = g.op("Resize", [x, undefined, g.constant("float32", [4], Float32Array.of(1, 1, 2, 2))], {
          mode: "nearest"
        })
        // He's scale, twice the variance: SiLU, like ReLU, passes on about half of it.
        x = silu(g, conv(g, doubled, random, channels, channels, 3, Math.sqrt(2 / (9 * channels)), "upsample.conv"))
      })
    }
    const out = conv(g, x, random, channels, 3, 3, Math.sqrt(1 / (9 * channels)), "decoder.conv_out")
    return g.op("Tanh", [out])
  })
  g.output(image, "decoded_image", "float32", ["batch_size", 3, pixels, pixels])
  return g
}

/** The six graphs by onnx/ stem, each from its own stream of `seed`. */
export const janusGraphs = (config: JanusConfig, seed: number): ReadonlyMap<string, Graph> => {
  const stream = (index: number) => new Random(seed * 16 + index)
  return new Map([
    ["prepare_inputs_embeds", prepareInputsEmbedsGraph(config, stream(1))],
    ["language_model", languageModelGraph(config, seed * 16 + 2)],
    ["lm_head", lmHeadGraph(config, stream(3))],
    ["gen_head", genHeadGraph(config, stream(4))],
    ["gen_img_embeds", genImgEmbedsGraph(config, stream(5))],
    ["image_decode", imageDecodeGraph(config, stream(6))]
  ])
}

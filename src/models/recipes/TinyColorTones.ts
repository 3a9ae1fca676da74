import { elementType, Graph } from "../onnx/Graph.js"
import { linear } from "../onnx/Layers.js"
import { type LinearWeights, matrix } from "../Weights.js"
import { type ColorPromptWeights, colorPromptWeights, poolColorWords, promptInputs } from "./ColorPrompt.js"
import { hiddenSize } from "./ColorChannels.js"
import { jsonFile, type ModelRecipe, recipeStamp } from "./Recipe.js"

/**
 * cornserve/tiny-color-tones: an audio generator for Geri that streams. It reads a prompt's token
 * embeddings from tiny-color-vlm's embed_tokens (not decoder hidden states) and plays a sine tone
 * whose pitch depends on the colour named. onnx/generator.onnx: inputs_embeds [batch, sequence,
 * 64], attention_mask, and chunk_index [batch] → pcm [batch, chunk_size], PCM16 at 16 kHz. Chunk n
 * holds samples n·chunk_size ..; chunks are independent, so a generator streams them in order.
 *
 * Weights: attention pooling over colour words (ColorPrompt.ts) gives mean ±1 RGB bits b; a linear
 * layer gives the frequency 600 + 200·b_R + 100·b_G + 50·b_B Hz, rounded to whole Hz: black 250,
 * blue 350, green 450, cyan 550, red 650, magenta 750, yellow 850, white 950. The phase is
 * computed in float64 from the absolute sample index, so chunks join without a click.
 */

const name = "cornserve/tiny-color-tones"
const version = 1

const toneSampleRate = 16_000
const toneChunkSize = 1_600
const defaultChunks = 10
/** Peak amplitude as a fraction of full scale. */
const toneLevel = 0.4

export interface TonesWeights {
  readonly prompt: ColorPromptWeights
  /** [3, 1]: pooled bits → frequency in Hz. */
  readonly frequency: LinearWeights
  readonly sampleRate: number
  readonly chunkSize: number
  /** Peak amplitude in PCM16 units. */
  readonly amplitude: number
}

/** The frequency the tones model plays for a colour, given its ±1 bits. */
export const toneFrequency = (bits: ReadonlyArray<number>): number =>
  600 + 200 * bits[0]! + 100 * bits[1]! + 50 * bits[2]!

export const tonesWeights = (): TonesWeights => ({
  prompt: colorPromptWeights(),
  frequency: { weight: matrix(3, 1, Float32Array.of(200, 100, 50)), bias: Float32Array.of(600) },
  sampleRate: toneSampleRate,
  chunkSize: toneChunkSize,
  amplitude: Math.round(toneLevel * 32767)
})

const tonesGraph = (w: TonesWeights): Graph => {
  const g = new Graph("generator")
  const { inputsEmbeds, attentionMask } = promptInputs(g)
  const chunkIndex = g.input("chunk_index", "int64", ["batch_size"])
  const pooled = poolColorWords(g, inputsEmbeds, attentionMask, w.prompt)
  const hertz = g.op("Round", [g.op("Reshape", [linear(g, pooled, w.frequency, "frequency"), g.int64s([0, 1])])])
  const first = g.op("Mul", [g.op("Unsqueeze", [chunkIndex, g.int64s([1])]), g.int64Scalar(w.chunkSize)])
  const sampleIndex = g.op("Add", [
    first,
    g.op("Range", [g.int64Scalar(0), g.int64Scalar(w.chunkSize), g.int64Scalar(1)])
  ])
  const toDouble = { to: elementType("float64") }
  const cycles = g.op("Div", [
    g.op("Mul", [g.op("Cast", [hertz], toDouble), g.op("Cast", [sampleIndex], toDouble)]),
    g.constant("float64", [], Float64Array.of(w.sampleRate))
  ])
  const phase = g.op("Sub", [cycles, g.op("Floor", [cycles])])
  const wave = g.op("Sin", [g.op("Mul", [phase, g.constant("float64", [], Float64Array.of(2 * Math.PI))])])
  const scaled = g.op("Mul", [g.op("Cast", [wave], { to: elementType("float32") }), g.floatScalar(w.amplitude)])
  const pcm = g.op("Cast", [g.op("Round", [scaled])], { to: elementType("int16") })
  g.output(pcm, "pcm", "int16", ["batch_size", w.chunkSize])
  return g
}

const build = () => {
  const config = {
    architectures: ["CornserveColorTones"],
    model_type: "cornserve_color_tones",
    cornserve: recipeStamp({ name, version }),
    generator: {
      modality: "audio",
      sample_rate: toneSampleRate,
      chunk_size: toneChunkSize,
      default_num_chunks: defaultChunks,
      sample_format: "pcm16"
    },
    prompt_embeddings: { model: "cornserve/tiny-color-vlm", source: "embed_tokens", hidden_size: hiddenSize }
  }
  return new Map([
    ["config.json", jsonFile(config)],
    ["onnx/generator.onnx", tonesGraph(tonesWeights()).toBytes()]
  ])
}

export const tinyColorTones: ModelRecipe = { name, version, build }

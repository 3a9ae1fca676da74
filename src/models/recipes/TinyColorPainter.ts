import { Graph } from "../onnx/Graph.js"
import { linear } from "../onnx/Layers.js"
import { type LinearWeights, matrix } from "../Weights.js"
import { type ColorPromptWeights, colorPromptWeights, poolColorWords, promptInputs } from "./ColorPrompt.js"
import { hiddenSize } from "./ColorChannels.js"
import { jsonFile, type ModelRecipe, recipeStamp } from "./Recipe.js"

/**
 * cornserve/tiny-color-painter: an image generator for Geri. It reads a prompt's token embeddings
 * from tiny-color-vlm's embed_tokens (not decoder hidden states) and paints the colour the prompt
 * names. onnx/generator.onnx: inputs_embeds [batch, sequence, 64] and attention_mask → images
 * [batch, 3, 128, 128], RGB in [0, 1].
 *
 * Weights: attention pooling over colour words (ColorPrompt.ts) gives mean ±1 RGB bits; a linear
 * layer maps them to a colour (bit × 0.5 + 0.5, clipped); each pixel is that colour blended
 * towards grey by a vignette (0 at the centre, 0.35 in the corners), so the mean colour of the
 * image is nearest to the named one. Two colours named give their mix; none gives grey.
 */

const name = "cornserve/tiny-color-painter"
const version = 1

const paintedImageSize = 128
const vignetteStrength = 0.35

export interface PainterWeights {
  readonly prompt: ColorPromptWeights
  /** [3, 3]: pooled bits → RGB. */
  readonly color: LinearWeights
  readonly imageSize: number
  /** [size, size]: how far each pixel is blended towards grey. */
  readonly vignette: Float32Array
}

export const painterWeights = (): PainterWeights => {
  const color = matrix(3, 3)
  for (let i = 0; i < 3; i++) color.data[i * 3 + i] = 0.5
  const size = paintedImageSize
  const centre = (size - 1) / 2
  const vignette = new Float32Array(size * size)
  for (let y = 0; y < size; y++) {
    for (let x = 0; x < size; x++) {
      vignette[y * size + x] = (vignetteStrength * ((x - centre) ** 2 + (y - centre) ** 2)) / (2 * centre ** 2)
    }
  }
  return {
    prompt: colorPromptWeights(),
    color: { weight: color, bias: new Float32Array(3).fill(0.5) },
    imageSize: size,
    vignette
  }
}

const painterGraph = (w: PainterWeights): Graph => {
  const g = new Graph("generator")
  const { inputsEmbeds, attentionMask } = promptInputs(g)
  const pooled = poolColorWords(g, inputsEmbeds, attentionMask, w.prompt)
  const rgb = g.op("Clip", [linear(g, pooled, w.color, "color"), g.floatScalar(0), g.floatScalar(1)])
  const color = g.op("Reshape", [rgb, g.int64s([0, 3, 1, 1])])
  const vignette = g.weight("vignette", "float32", [1, 1, w.imageSize, w.imageSize], w.vignette)
  const kept = g.op("Mul", [color, g.op("Sub", [g.floatScalar(1), vignette])])
  const images = g.op("Add", [kept, g.op("Mul", [vignette, g.floatScalar(0.5)])])
  g.output(images, "images", "float32", ["batch_size", 3, w.imageSize, w.imageSize])
  return g
}

const build = () => {
  const config = {
    architectures: ["CornserveColorPainter"],
    model_type: "cornserve_color_painter",
    cornserve: recipeStamp({ name, version }),
    generator: { modality: "image", height: paintedImageSize, width: paintedImageSize },
    prompt_embeddings: { model: "cornserve/tiny-color-vlm", source: "embed_tokens", hidden_size: hiddenSize }
  }
  return new Map([
    ["config.json", jsonFile(config)],
    ["onnx/generator.onnx", painterGraph(painterWeights()).toBytes()]
  ])
}

export const tinyColorPainter: ModelRecipe = { name, version, build }

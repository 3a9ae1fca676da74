import { maskedScore } from "../onnx/Attention.js"
import { elementType, type Graph, type Value } from "../onnx/Graph.js"
import { matrixWeight } from "../onnx/Layers.js"
import { type Matrix, matrix } from "../Weights.js"
import { channel, hiddenSize, readChannel } from "./ColorChannels.js"

/**
 * How the painter and the tones read a prompt: one attention query that scores each token by its
 * colour-word flag, so the pooled row is the mean ±1 RGB bits of the colour words in the prompt
 * (0 when it names none). The prompt is tiny-color-vlm's embed_tokens output, with attention_mask.
 */

export interface ColorPromptWeights {
  /** [hidden, 1]: the attention score of each token. */
  readonly score: Matrix
  /** [hidden, 3]: the RGB bits a token carries. */
  readonly bits: Matrix
}

/** Score of a colour word; other tokens score 0, so e^-20 of the attention is left for them. */
const colorWordScore = 20

export const colorPromptWeights = (): ColorPromptWeights => {
  const score = matrix(hiddenSize, 1)
  readChannel(score, channel.colorWord, 0, colorWordScore)
  const bits = matrix(hiddenSize, 3)
  for (let i = 0; i < 3; i++) readChannel(bits, channel.wordBits + i, i, 1)
  return { score, bits }
}

/** The generators' inputs: inputs_embeds [batch, sequence, hidden] and attention_mask [batch, sequence]. */
export const promptInputs = (g: Graph) => ({
  inputsEmbeds: g.input("inputs_embeds", "float32", ["batch_size", "sequence_length", hiddenSize]),
  attentionMask: g.input("attention_mask", "int64", ["batch_size", "sequence_length"])
})

/** → [batch, 1, 3], the pooled RGB bits. */
export const poolColorWords = (g: Graph, inputsEmbeds: Value, attentionMask: Value, w: ColorPromptWeights): Value =>
  g.scope("color_words", () => {
    const scores = g.op("Transpose", [g.op("MatMul", [inputsEmbeds, matrixWeight(g, "score", w.score)])], {
      perm: [0, 2, 1]
    })
    const visible = g.op("Unsqueeze", [g.op("Cast", [attentionMask], { to: elementType("bool") }), g.int64s([1])])
    const attention = g.op("Softmax", [g.op("Where", [visible, scores, g.floatScalar(maskedScore)])], { axis: -1 })
    return g.op("MatMul", [attention, g.op("MatMul", [inputsEmbeds, matrixWeight(g, "bits", w.bits)])])
  })

import type * as ort from "onnxruntime-node"
import type { Random } from "../../../src/models/Random.js"
import { decoderForward } from "../../../src/models/reference/Transformer.js"
import type { DecoderWeights } from "../../../src/models/Weights.js"
import { expectClose, floatTensor, int64Tensor } from "./Ort.js"

/**
 * Runs decoder_model_merged on random inputs embeddings and a random cache of 4 positions (the
 * second sequence left-padded by two) and checks logits and every present key and value against
 * the float64 reference.
 */
export const expectDecoderMatchesReference = async (
  decoder: ort.InferenceSession,
  weights: DecoderWeights,
  random: Random
) => {
  const hidden = weights.embedTokens.cols
  const heads = weights.layers[0]!.attention.heads
  const [batch, pastLength, sequence] = [2, 4, 3]
  const cacheDims = [batch, heads, pastLength, hidden / heads]
  const past = weights.layers.map(() => ({
    key: Float32Array.from({ length: batch * pastLength * hidden }, () => random.normal()),
    value: Float32Array.from({ length: batch * pastLength * hidden }, () => random.normal())
  }))
  const inputsEmbeds = Float32Array.from({ length: batch * sequence * hidden }, () => random.normal())
  const attentionMask = [1, 1, 1, 1, 1, 1, 1, 0, 0, 1, 1, 1, 1, 1]
  const positionIds = [4, 5, 6, 2, 3, 4]
  const feeds: Record<string, ort.Tensor> = {
    inputs_embeds: floatTensor(inputsEmbeds, [batch, sequence, hidden]),
    attention_mask: int64Tensor(attentionMask, [batch, pastLength + sequence]),
    position_ids: int64Tensor(positionIds, [batch, sequence])
  }
  past.forEach((layer, i) => {
    feeds[`past_key_values.${i}.key`] = floatTensor(layer.key, cacheDims)
    feeds[`past_key_values.${i}.value`] = floatTensor(layer.value, cacheDims)
  })
  const outputs = await decoder.run(feeds)
  const expected = decoderForward(weights, {
    batch,
    sequence,
    pastLength,
    inputsEmbeds,
    attentionMask,
    positionIds,
    past
  })
  expectClose(outputs.logits, expected.logits, "logits")
  expected.present.forEach((layer, i) => {
    expectClose(outputs[`present.${i}.key`], layer.key, `present.${i}.key`)
    expectClose(outputs[`present.${i}.value`], layer.value, `present.${i}.value`)
  })
}

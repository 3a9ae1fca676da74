import onnxProto from "onnx-proto"
import * as ort from "onnxruntime-node"
import { describe, expect, it } from "vitest"
import { llamaGraphs } from "../../src/models/architectures/Llama.js"
import type { Dtype } from "../../src/models/Dtype.js"
import { Graph } from "../../src/models/onnx/Graph.js"
import { exposeHiddenStates, hiddenStatesOutput } from "../../src/models/onnx/HiddenStatesOutput.js"
import { float32Data } from "../../src/executors/llm/Tensors.js"
import { fromHalf, toHalf } from "../../src/models/Float16.js"
import { smallLlamaConfig } from "./support/SmallLlama.js"

/**
 * The load-time rewrite that gives a text-generation export's final hidden states: on the
 * community's decoder-only layout at every dtype, its last_hidden_state is, bit for bit, what the
 * same model exported without an lm_head (as embedding models are) answers, and its logits are
 * the export's.
 */

const { onnx } = onnxProto
const config = smallLlamaConfig

const decoder = (dtype: Dtype, output: "logits" | "last_hidden_state") =>
  llamaGraphs(
    config,
    { layout: "decoder-only", dtype, positionIds: true, pastPrefix: "past_key_values", seed: 4, std: 0.1, output },
    (name) => new Graph(name)
  )
    .get("model")!
    .toBytes()

/** A 7-token prompt with no past, as a prefill runs it. */
const prompt = (session: ort.InferenceSession): Record<string, ort.Tensor> => {
  const length = 7
  const feeds: Record<string, ort.Tensor> = {
    input_ids: new ort.Tensor(
      "int64",
      BigInt64Array.from({ length }, (_, i) => BigInt((i * 37 + 5) % 512)),
      [1, length]
    ),
    attention_mask: new ort.Tensor("int64", new BigInt64Array(length).fill(1n), [1, length]),
    position_ids: new ort.Tensor(
      "int64",
      BigInt64Array.from({ length }, (_, i) => BigInt(i)),
      [1, length]
    )
  }
  for (const name of session.inputNames.filter((input) => input.startsWith("past_key_values."))) {
    const cacheType = session.inputMetadata.find((value) => value.name === name)
    const half = cacheType?.isTensor === true && cacheType.type === "float16"
    const dims = [1, config.kvHeads, 0, config.headDim]
    feeds[name] = half
      ? new ort.Tensor("float16", new Uint16Array(0), dims)
      : new ort.Tensor("float32", new Float32Array(0), dims)
  }
  return feeds
}

const run = async (bytes: Uint8Array, outputs: ReadonlyArray<string>) => {
  const session = await ort.InferenceSession.create(bytes, { intraOpNumThreads: 1 })
  try {
    const answer = await session.run(prompt(session), [...outputs])
    return outputs.map((name) => answer[name]!)
  } finally {
    await session.release()
  }
}

describe("exposeHiddenStates", () => {
  it.each(["fp32", "fp16", "q8", "q4", "q4f16"] as const)(
    "%s: gives the final norm's output as last_hidden_state, and the logits as exported",
    async (dtype) => {
      const exported = decoder(dtype, "logits")
      const rewritten = exposeHiddenStates(exported)
      if (rewritten.bytes === undefined) throw new Error(`not rewritten: ${rewritten.reason}`)
      const [states, logits] = await run(rewritten.bytes, [hiddenStatesOutput, "logits"])
      const [reference] = await run(decoder(dtype, "last_hidden_state"), [hiddenStatesOutput])
      const [exportedLogits] = await run(exported, ["logits"])
      expect(states!.dims).toEqual([1, 7, config.hiddenSize])
      // An fp16 export that computes in fp32 (as these do) gives its output cast to fp16: the norm's
      // output is the floats before that cast.
      const ours = float32Data(states!)
      expect(Array.from(reference!.type === states!.type ? ours : ours.map((v) => fromHalf(toHalf(v))))).toEqual(
        Array.from(float32Data(reference!))
      )
      expect(Array.from(float32Data(logits!))).toEqual(Array.from(float32Data(exportedLogits!)))
    }
  )

  it("leaves a graph with no lm_head near its logits, or no logits, as it is, saying why", () => {
    const model = onnx.ModelProto.decode(decoder("fp32", "logits"))
    const graph = model.graph!
    const final = graph.node!.find((node) => node.output!.includes("logits"))!
    // logits read straight from the norm: no product by a weight.
    final.opType = "Identity"
    final.input = [final.input![0]!]
    const noHead = exposeHiddenStates(onnx.ModelProto.encode(model).finish())
    expect(noHead.bytes).toBeUndefined()
    expect(noHead).toMatchObject({ reason: expect.stringMatching(/no lm_head/) })
    const embedder = exposeHiddenStates(decoder("fp32", "last_hidden_state"))
    expect(embedder).toMatchObject({ reason: expect.stringMatching(/already/) })
  })
})

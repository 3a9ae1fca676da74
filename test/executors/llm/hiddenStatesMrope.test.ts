import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { AutoProcessor, RawImage, type Tensor } from "@huggingface/transformers"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { mropePositions } from "../../../src/models/MRope.js"
import type { GridThw } from "../../../src/models/Qwen2VLProcessor.js"
import {
  qwen2VLSpecialTokens,
  randomQwen2VLFiles,
  randomQwen2VLWeights
} from "../../../src/models/recipes/RandomQwen2VL.js"
import { relativeError } from "../../models/support/Ort.js"
import {
  referenceDecoderHiddenStates,
  referenceEmbeddings,
  referenceQwen2VLGreedy,
  referenceVisionFeatures
} from "../../models/support/Qwen2VLModelReference.js"
import { writeModelFiles } from "../../models/support/SmolVlmFixture.js"
import { offline } from "../../models/support/TransformersJs.js"
import { executorHeaders, startExecutor } from "../../support/executors.js"
import { gradientPng } from "../../support/mllmApps.js"

/**
 * An LLM embedding task's `generate` on a model with multimodal rotary positions (Qwen2-VL): the
 * executor answers an image chat, then gives the final hidden states of the prompt and of the
 * tokens it generated, the generated ones at their index plus the prompt's M-RoPE delta on all
 * three axes, as decoding placed them. Both the tokens and the hidden states are the float64
 * reference computation's (transformers' modeling_qwen2_vl.py written out), on the prompt and
 * pixels transformers.js's processor makes.
 */

const seed = 1
const maxTokens = 5

describe("hidden states of a generated answer under M-RoPE", () => {
  let root: string
  let model: string
  let executor: Awaited<ReturnType<typeof startExecutor>>
  const fixture = randomQwen2VLFiles({ seed })
  const weights = randomQwen2VLWeights(fixture.config, seed)

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-mrope-states-"))
    model = join(root, "qwen2-vl-tiny")
    await writeModelFiles(model, fixture.files)
    executor = await startExecutor(["--kind", "llm", "--model", model, "--devices", "cpu:0"], {
      CORNSERVE_MODEL_DIR: root,
      CORNSERVE_MODEL_ROOTS: root
    })
  }, 120_000)

  afterAll(async () => {
    executor?.process.kill("SIGTERM")
    if (root !== undefined) await rm(root, { recursive: true, force: true })
  })

  it("gives the prompt's and the answer's hidden states as the reference computes them", async () => {
    const png = await gradientPng(84, 56)
    const question = "What is in this image?"
    const response = await fetch(`${executor.url}/v1/cornserve/prompt-embeddings`, {
      method: "POST",
      headers: executorHeaders({ "content-type": "application/json" }),
      body: JSON.stringify({
        messages: [
          {
            role: "user",
            content: [
              { type: "image_url", image_url: { url: `data:image/png;base64,${png.toString("base64")}` } },
              { type: "text", text: question }
            ]
          }
        ],
        id: "states",
        source: "hidden_states",
        return: "inline",
        generate: { max_tokens: maxTokens }
      })
    })
    const answer = (await response.json()) as {
      shape: [number, number]
      embedding: Array<number>
      completion: { token_ids: Array<number> }
    }
    expect(response.status, JSON.stringify(answer)).toBe(200)

    const processor = await AutoProcessor.from_pretrained(offline(model))
    const prompt = processor.apply_chat_template(
      [{ role: "user", content: [{ type: "image" }, { type: "text", text: question }] }],
      { add_generation_prompt: true }
    ) as string
    const inputs = await processor(prompt, await RawImage.fromBlob(new Blob([new Uint8Array(png)])))
    const ids = Array.from((inputs.input_ids as Tensor).data as BigInt64Array, Number)
    const grid = Array.from((inputs.image_grid_thw as Tensor).data as BigInt64Array, Number) as unknown as GridThw
    const pads = {
      imagePad: fixture.tokenId(qwen2VLSpecialTokens.imagePad),
      videoPad: fixture.tokenId(qwen2VLSpecialTokens.videoPad)
    }
    const features = referenceVisionFeatures(weights.vision, (inputs.pixel_values as Tensor).data as Float32Array, [
      grid
    ])
    const { positions, delta } = mropePositions(ids, pads, { images: [grid], videos: [] }, 2)
    expect(delta).not.toBe(0)
    const padSet = new Set([pads.imagePad])
    const generated = answer.completion.token_ids
    // The reference's greedy answer, to the executor's end of sequence.
    expect(generated).toEqual(
      referenceQwen2VLGreedy(weights.text, ids, padSet, features, positions, delta, generated.length)
    )

    // The whole sequence at once: the prompt at its M-RoPE positions, each answer token at index + delta.
    let feature = 0
    const embeds = [
      ...referenceEmbeddings(weights.text, ids).map((row, i) => (padSet.has(ids[i]!) ? features[feature++]! : row)),
      ...referenceEmbeddings(weights.text, generated)
    ]
    const axes = [0, 1, 2].map((axis) => [
      ...Array.from(positions.subarray(axis * ids.length, (axis + 1) * ids.length)),
      ...generated.map((_, i) => ids.length + i + delta)
    ])
    const expected = referenceDecoderHiddenStates(weights.text, embeds, axes)
    const hidden = weights.text.config.hiddenSize
    expect(answer.shape).toEqual([ids.length + generated.length, hidden])
    const flat = Float64Array.from(expected.flatMap((row) => Array.from(row)))
    expect(relativeError(answer.embedding, flat)).toBeLessThanOrEqual(1e-4)
    // The answer's rows alone: were they placed at the prompt's positions instead, they would differ.
    const answerRows = answer.embedding.slice(ids.length * hidden)
    expect(relativeError(answerRows, flat.subarray(ids.length * hidden))).toBeLessThanOrEqual(1e-4)
  })
})

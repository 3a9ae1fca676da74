import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { KvCacheMode } from "../../../src/executors/llm/DecoderPlan.js"
import { exportPrefix, importPrefix } from "../../../src/executors/llm/PrefixTransfer.js"
import type { SamplingParams } from "../../../src/executors/llm/protocol.js"
import { Runner } from "../../../src/executors/llm/Runner.js"
import type { Dtype } from "../../../src/models/Dtype.js"
import { loadModelDirectory } from "../../../src/models/ModelDirectory.js"
import { randomLlamaFiles } from "../../../src/models/recipes/RandomLlama.js"
import { writeModelFiles } from "../../models/support/EmbeddingFixtures.js"
import { smallLlamaConfig } from "../../models/support/SmallLlama.js"

/**
 * A prompt's KV cache moved from one runner to another of the same model as prefix cache blocks
 * (PrefixTransfer.ts), in process: the receiver, given the prompt, prefills only its last part and
 * answers the greedy tokens a runner that prefilled it all answers; on the shared cache and on
 * copies, in fp32 and fp16. What it refuses: another geometry or precision, a length that is not
 * the prompt's whole blocks.
 */

const config = smallLlamaConfig
let root: string

beforeAll(async () => {
  root = await mkdtemp(join(tmpdir(), "cornserve-prefix-transfer-"))
  await writeModelFiles(root, randomLlamaFiles({ config, layout: "decoder-only", dtypes: ["fp32", "fp16"], seed: 8 }))
})

afterAll(async () => {
  await rm(root, { recursive: true, force: true })
})

const prompt = { inputIds: Int32Array.from({ length: 43 }, (_, i) => (i * 29 + 3) % config.vocabSize), media: [] }
const greedy: SamplingParams = { temperature: 0, topP: 1, seed: 0, maxNewTokens: 10, stopTokenIds: [] }

/** The greedy tokens `runner` answers for the prompt, one step at a time. */
const generate = async (runner: Runner): Promise<Array<number>> => {
  const tokens: Array<number> = []
  let items: Array<Parameters<Runner["step"]>[0][number]> = [
    { id: "r", op: { op: "prefill", prompt, sampling: greedy } }
  ]
  while (tokens.length < greedy.maxNewTokens) {
    let finished = false
    await runner.step(items, (_, partial) => {
      tokens.push(partial.token)
      if (partial.finish !== undefined) finished = true
    })
    if (finished) break
    items = [{ id: "r", op: { op: "decode" } }]
  }
  return tokens
}

const open = async (dtype: Dtype, kvCache: KvCacheMode) =>
  Runner.open(await loadModelDirectory(root), "cpu", 1, dtype, { kvCache })

describe("a prompt's KV cache from one runner to another", () => {
  it.each([
    ["fp32", "shared"],
    ["fp32", "copies"],
    ["fp16", "shared"]
  ] as const)(
    "%s, %s cache: the receiver prefills the rest and answers as one that prefilled it all",
    async (dtype, kvCache) => {
      const [alone, sender, receiver] = await Promise.all([
        open(dtype, kvCache),
        open(dtype, kvCache),
        open(dtype, kvCache)
      ])
      try {
        const expected = await generate(alone)
        const exported = await exportPrefix(sender, prompt)
        if ("error" in exported) throw new Error(exported.error)
        // 43 tokens: two whole blocks of 16, the rest (and the first token) the receiver's.
        expect(exported.shape).toEqual([2 * config.layers, config.kvHeads, 32, config.headDim])
        for (const tensor of exported.tensors)
          expect(tensor).toBeInstanceOf(sender.prefixCache!.geometry.half ? Uint16Array : Float32Array)
        expect(importPrefix(receiver, prompt, exported)).toEqual({ positions: 32 })
        expect(await generate(receiver)).toEqual(expected)
        expect(receiver.prefixCache!.stats).toMatchObject({ hits: 1, hitTokens: 32 })
      } finally {
        await Promise.all([alone.close(), sender.close(), receiver.close()])
      }
    }
  )

  it("refuses a cache of another geometry or precision, or that is not the prompt's whole blocks", async () => {
    const [sender, receiver] = await Promise.all([open("fp32", "shared"), open("fp32", "shared")])
    try {
      const exported = await exportPrefix(sender, prompt)
      if ("error" in exported) throw new Error(exported.error)
      const [tensors, heads, positions, headDim] = exported.shape
      expect(
        importPrefix(receiver, prompt, { ...exported, tensors: exported.tensors.map((t) => new Uint16Array(t.length)) })
      ).toEqual({
        error: expect.stringMatching(/float16.*float32/)
      })
      expect(importPrefix(receiver, prompt, { ...exported, shape: [tensors, heads + 1, positions, headDim] })).toEqual({
        error: expect.stringMatching(/this model's is/)
      })
      const twenty = { ...prompt, inputIds: prompt.inputIds.subarray(0, 20) }
      expect(importPrefix(receiver, twenty, exported)).toEqual({ error: expect.stringMatching(/not whole blocks/) })
      const cut = exported.tensors.map((t, i) => (i === 3 ? t.subarray(1) : t))
      expect(importPrefix(receiver, prompt, { ...exported, tensors: cut })).toEqual({
        error: expect.stringMatching(/cache tensor 3 holds/)
      })
      expect(importPrefix(receiver, prompt, { ...exported, tensors: exported.tensors.slice(1) })).toEqual({
        error: expect.stringMatching(/holds \d+ tensors/)
      })
      // 16 tokens: a block, but no token after it to run: nothing to send, and nothing taken.
      const short = { ...prompt, inputIds: prompt.inputIds.subarray(0, 16) }
      const empty = await exportPrefix(sender, short)
      if ("error" in empty) throw new Error(empty.error)
      expect(empty.shape).toEqual([tensors, heads, 0, headDim])
      expect(empty.tensors.every((tensor) => tensor.length === 0)).toBe(true)
      expect(importPrefix(receiver, short, empty)).toEqual({ positions: 0 })
      expect(receiver.prefixCache!.stats.blocks).toBe(0)
    } finally {
      await Promise.all([sender.close(), receiver.close()])
    }
  })
})

import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { KvCacheMode } from "../../../src/executors/llm/DecoderPlan.js"
import { checkPrefix, exportPrefix, importedPast } from "../../../src/executors/llm/PrefixTransfer.js"
import type { PastData } from "../../../src/executors/llm/PastCache.js"
import { floatsOf } from "../../../src/models/Float16.js"
import type { SamplingParams } from "../../../src/executors/llm/protocol.js"
import { Runner } from "../../../src/executors/llm/Runner.js"
import type { Dtype } from "../../../src/models/Dtype.js"
import { loadModelDirectory } from "../../../src/models/ModelDirectory.js"
import { randomLlamaFiles } from "../../../src/models/recipes/RandomLlama.js"
import { writeModelFiles } from "../../models/support/EmbeddingFixtures.js"
import { smallLlamaConfig } from "../../models/support/SmallLlama.js"

/**
 * A prompt's KV cache moved from one runner to another of the same model (PrefixTransfer.ts), in
 * process: the receiver, given the prompt and the cache of all of it but its last token, runs only
 * that token and answers the greedy tokens a runner that prefilled it all answers; on the shared
 * cache and on copies, in fp32 and fp16. What it refuses: another geometry or precision, positions
 * that leave the prompt no token to run.
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
const generate = async (runner: Runner, imported?: PastData, id = "r"): Promise<Array<number>> => {
  const tokens: Array<number> = []
  let items: Array<Parameters<Runner["step"]>[0][number]> = [
    { id, op: { op: "prefill", prompt, sampling: greedy }, ...(imported === undefined ? {} : { imported }) }
  ]
  while (tokens.length < greedy.maxNewTokens) {
    let finished = false
    await runner.step(items, (_, partial) => {
      tokens.push(partial.token)
      if (partial.finish !== undefined) finished = true
    })
    if (finished) break
    items = [{ id, op: { op: "decode" } }]
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
    "%s, %s cache: the receiver runs the last token and answers as one that prefilled it all",
    async (dtype, kvCache) => {
      const [alone, sender, receiver] = await Promise.all([
        open(dtype, kvCache),
        open(dtype, kvCache),
        open(dtype, kvCache)
      ])
      try {
        const expected = await generate(alone)
        const exported = await exportPrefix(sender, prompt)
        expect(exported.shape).toEqual([2 * config.layers, config.kvHeads, 42, config.headDim])
        for (const tensor of exported.tensors)
          expect(tensor).toBeInstanceOf(sender.cacheGeometry.half ? Uint16Array : Float32Array)
        const taken = importedPast(receiver.cacheGeometry, prompt, exported)
        if (!("past" in taken) || taken.past === undefined) throw new Error(JSON.stringify(taken))
        expect(await generate(receiver, taken.past)).toEqual(expected)
        // It stays out of the receiver's prefix cache.
        expect(receiver.prefixCache!.stats).toMatchObject({ lookups: 0, blocks: 0 })
        expect(exported.cached).toBe(0)

        // The same prompt again (the next turn of a chat starts with it): the sender runs only what
        // follows the blocks its prefix cache kept, and the cache it sends answers alike.
        const again = await exportPrefix(sender, prompt)
        expect(again.cached).toBe(32)
        expect(sender.prefixCache!.stats).toMatchObject({ hits: 1, hitTokens: 32 })
        again.tensors.forEach((tensor, t) => {
          const first = exported.tensors[t]!
          const values = (array: typeof tensor) => (array instanceof Uint16Array ? floatsOf(array) : array)
          const [a, b] = [values(tensor), values(first)]
          expect(a.length).toBe(b.length)
          let worst = 0
          for (let i = 0; i < a.length; i++) worst = Math.max(worst, Math.abs(a[i]! - b[i]!))
          expect(worst).toBeLessThan(dtype === "fp16" ? 1e-2 : 1e-5)
        })
        const retaken = importedPast(receiver.cacheGeometry, prompt, again)
        if (!("past" in retaken) || retaken.past === undefined) throw new Error(JSON.stringify(retaken))
        expect(await generate(receiver, retaken.past, "again")).toEqual(expected)
      } finally {
        await Promise.all([alone.close(), sender.close(), receiver.close()])
      }
    }
  )

  it("refuses a cache of another geometry or precision, or that leaves no token to run; a one-token prompt sends none", async () => {
    const [sender, receiver] = await Promise.all([open("fp32", "shared"), open("fp32", "shared")])
    try {
      const exported = await exportPrefix(sender, prompt)
      const [tensors, heads, positions, headDim] = exported.shape
      const geometry = receiver.cacheGeometry
      expect(checkPrefix(geometry, prompt, exported.shape, "float16")).toEqual({
        error: expect.stringMatching(/float16.*float32/)
      })
      expect(checkPrefix(geometry, prompt, [tensors, heads + 1, positions, headDim], "float32")).toEqual({
        error: expect.stringMatching(/this model's is/)
      })
      const short = { ...prompt, inputIds: prompt.inputIds.subarray(0, 20) }
      expect(checkPrefix(geometry, short, exported.shape, "float32")).toEqual({
        error: expect.stringMatching(/leave none of the prompt's 20 tokens/)
      })
      const cut = exported.tensors.map((t, i) => (i === 3 ? t.subarray(1) : t))
      expect(importedPast(geometry, prompt, { ...exported, tensors: cut })).toEqual({
        error: expect.stringMatching(/cache tensor 3 holds/)
      })
      expect(importedPast(geometry, prompt, { ...exported, tensors: exported.tensors.slice(1) })).toEqual({
        error: expect.stringMatching(/holds \d+ tensors/)
      })
      const one = { ...prompt, inputIds: prompt.inputIds.subarray(0, 1) }
      const empty = await exportPrefix(sender, one)
      expect(empty.shape).toEqual([tensors, heads, 0, headDim])
      expect(importedPast(geometry, one, empty)).toEqual({ past: undefined })
    } finally {
      await Promise.all([sender.close(), receiver.close()])
    }
  })
})

import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import type { SamplingParams, TokenPartial } from "../../../src/executors/llm/protocol.js"
import type { StepItem } from "../../../src/executors/llm/StepRunner.js"
import { TalkerRunner } from "../../../src/executors/llm/TalkerRunner.js"
import { loadModelDirectory } from "../../../src/models/ModelDirectory.js"
import { Random } from "../../../src/models/Random.js"
import { talkerFiles, tinyTalkerSize } from "../../../src/models/recipes/TinyTalker.js"
import { InvalidModelDirectory } from "../../../src/models/ModelDirectory.js"
import { talkerSpec } from "../../../src/models/TalkerModel.js"
import { writeModelFiles } from "../../models/support/EmbeddingFixtures.js"
import { talkerReference } from "../../support/talkerReference.js"

/**
 * The talker's side of the LLM executor (TalkerRunner.ts) on the built-in tiny talker: its greedy
 * frames are the talker's graphs run in sequence in-process, alone and beside other requests that
 * join and leave; a frame limit ends a request with "length", the end-of-speech code with "stop"
 * and no frame; a seeded draw repeats.
 */

const thinkerHidden = tinyTalkerSize.thinkerHiddenSize
const codebooks = tinyTalkerSize.codebooks

const hiddenStates = (rows: number, seed: number) => new Random(seed).normals(rows * thinkerHidden, 1)

const talk = (id: string, states: Float32Array, sampling: Partial<SamplingParams> = {}): StepItem => {
  const rows = states.length / thinkerHidden
  return {
    id,
    op: {
      op: "prefill",
      prompt: {
        inputIds: new Int32Array(rows),
        media: [{ start: 0, rows, input: { kind: "embedding", data: states, shape: [rows, thinkerHidden] } }]
      },
      sampling: { temperature: 0, topP: 1, seed: 0, maxNewTokens: 12, stopTokenIds: [], ...sampling }
    }
  }
}

/** Steps the runner until every request has finished: each request's partials, in order. */
const runAll = async (runner: TalkerRunner, joining: ReadonlyArray<ReadonlyArray<StepItem>>) => {
  const partials = new Map<string, Array<TokenPartial>>()
  const going = new Set<string>()
  for (let step = 0; step < 200 && (step < joining.length || going.size > 0); step++) {
    const items: Array<StepItem> = [
      ...[...going].map((id): StepItem => ({ id, op: { op: "decode" } })),
      ...(joining[step] ?? [])
    ]
    for (const item of joining[step] ?? []) going.add(item.id)
    await runner.step(items, (index, partial) => {
      const id = items[index]!.id
      partials.set(id, [...(partials.get(id) ?? []), partial])
      if (partial.finish !== undefined) going.delete(id)
    })
  }
  return partials
}

describe("the talker runner", () => {
  let root: string
  let endless: string
  let silent: string

  beforeAll(async () => {
    root = await mkdtemp(join(tmpdir(), "cornserve-talker-"))
    endless = join(root, "endless")
    silent = join(root, "silent")
    await writeModelFiles(endless, talkerFiles())
    // The end of speech made certain: the first frame chosen is the end.
    await writeModelFiles(silent, talkerFiles({ endBias: 1000 }))
  })

  afterAll(async () => {
    await rm(root, { recursive: true, force: true })
  })

  it("writes the frames of the graphs run in sequence, alone and beside requests that join and leave", async () => {
    const runner = await TalkerRunner.open(await loadModelDirectory(endless), "cpu", 1)
    try {
      const states = [hiddenStates(9, 1), hiddenStates(4, 2), hiddenStates(15, 3)]
      const expected = await Promise.all(states.map((s) => talkerReference(talkerFiles(), s, thinkerHidden, 12)))
      const alone = await runAll(runner, [[talk("a", states[0]!)]])
      // b joins at the first step, c at the fourth; c stops early at 5 frames.
      const together = await runAll(runner, [
        [talk("a", states[0]!), talk("b", states[1]!)],
        [],
        [],
        [talk("c", states[2]!, { maxNewTokens: 5 })]
      ])
      const framesOf = (partials: ReadonlyArray<TokenPartial> | undefined) => partials!.map((p) => p.frame)
      expect(framesOf(alone.get("a"))).toEqual(expected[0])
      expect(framesOf(together.get("a"))).toEqual(expected[0])
      expect(framesOf(together.get("b"))).toEqual(expected[1])
      expect(framesOf(together.get("c"))).toEqual(expected[2]!.slice(0, 5))
      for (const partials of together.values()) {
        expect(partials.at(-1)!.finish).toBe("length")
        expect(partials.slice(0, -1).every((p) => p.finish === undefined)).toBe(true)
        for (const { frame, token } of partials) {
          expect(frame).toHaveLength(codebooks)
          expect(frame![0]).toBe(token)
          expect(frame!.every((code) => code >= 0 && code < tinyTalkerSize.codebookSize)).toBe(true)
        }
      }
      expect(runner.held).toEqual([])
    } finally {
      await runner.close()
    }
  })

  it("ends a request at the end-of-speech code with no frame, and repeats a seeded draw", async () => {
    const quiet = await TalkerRunner.open(await loadModelDirectory(silent), "cpu", 1)
    try {
      const partials = await runAll(quiet, [[talk("a", hiddenStates(5, 4))]])
      expect(partials.get("a")).toEqual([{ token: tinyTalkerSize.codebookSize + 1, finish: "stop" }])
    } finally {
      await quiet.close()
    }
    const runner = await TalkerRunner.open(await loadModelDirectory(endless), "cpu", 1)
    try {
      const states = hiddenStates(6, 5)
      const drawn = async (seed: number) =>
        (await runAll(runner, [[talk(`s${seed}`, states, { temperature: 1, seed })]]))
          .get(`s${seed}`)!
          .map((p) => p.frame)
      const first = await drawn(7)
      expect(await drawn(7)).toEqual(first)
      expect(await drawn(8)).not.toEqual(first)
    } finally {
      await runner.close()
    }
  })

  it("refuses prompt embeddings, and a prompt that is not hidden states", async () => {
    const runner = await TalkerRunner.open(await loadModelDirectory(endless), "cpu", 1)
    try {
      const [refused] = await runner.step(
        [
          {
            id: "e",
            op: {
              op: "embed",
              prompt: { inputIds: Int32Array.of(1), media: [] },
              id: "x",
              source: "hidden_states",
              receivers: [],
              inline: true
            }
          }
        ],
        () => undefined
      )
      expect(refused).toEqual({ error: expect.stringMatching(/codec frames/) })
      await expect(
        runner.step(
          [
            {
              id: "t",
              op: {
                op: "prefill",
                prompt: { inputIds: Int32Array.of(1, 2), media: [] },
                sampling: { temperature: 0, topP: 1, seed: 0, maxNewTokens: 4, stopTokenIds: [] }
              }
            }
          ],
          () => undefined
        )
      ).rejects.toThrow(/hidden states/)
    } finally {
      await runner.close()
    }
  })

  it("names what is wrong with a talker's config", async () => {
    const broken = join(root, "broken")
    const files = new Map(talkerFiles())
    const config = JSON.parse(new TextDecoder().decode(files.get("config.json")!))
    files.set("config.json", new TextEncoder().encode(JSON.stringify({ ...config, vocab_size: 64 })))
    await writeModelFiles(broken, files)
    const model = await loadModelDirectory(broken)
    expect(() => talkerSpec(model)).toThrow(InvalidModelDirectory)
    expect(() => talkerSpec(model)).toThrow(/vocab_size 64/)
  })
})

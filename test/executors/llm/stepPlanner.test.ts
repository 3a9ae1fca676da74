import { describe, expect, it } from "vitest"
import { chunkBounds, type PlannerOptions, StepPlanner } from "../../../src/executors/llm/StepPlanner.js"

/** The decoder as exported (prompts batch), chunks of `chunkTokens`. */
const planner = (options: Partial<PlannerOptions> = {}) =>
  new StepPlanner({ chunkTokens: 8, promptsApart: false, rowsApart: false, batchesPrompts: true, ...options })

const prompt = (id: string, promptLength: number, length = 0) => ({ id, length, promptLength })

describe("StepPlanner: chunked prefill", () => {
  it("with nothing decoding, prefills every prompt whole in one batch, and they all decode on", () => {
    const plan = planner().plan({
      prefilling: [prompt("a", 30), prompt("b", 5)],
      decoding: [],
      othersDecode: false
    })
    expect(plan).toEqual({ whole: ["a", "b"], pieces: [], decode: ["a", "b"], rowsApart: false, adaptive: false })
  })

  it("beside decoding requests, a long prompt runs a chunk a step until it is done, then decodes", () => {
    const steps = planner()
    let length = 0
    const counts: Array<number> = []
    for (;;) {
      const plan = steps.plan({ prefilling: [prompt("long", 20, length)], decoding: ["r1", "r2"], othersDecode: true })
      expect(plan.whole).toEqual([])
      const [piece] = plan.pieces
      counts.push(piece!.count)
      length += piece!.count
      if (length === 20) {
        expect(plan.decode).toEqual(["r1", "r2", "long"])
        break
      }
      expect(plan.decode).toEqual(["r1", "r2"])
    }
    expect(counts).toEqual([8, 8, 4])
  })

  it("shares the step's budget: a short prompt whole, then a piece of the next within what is left", () => {
    const plan = planner().plan({
      prefilling: [prompt("short", 3), prompt("long", 40), prompt("later", 4)],
      decoding: ["r"],
      othersDecode: true
    })
    // 3 + 5 = the chunk of 8; "later" waits for the next step.
    expect(plan.whole).toEqual(["short"])
    expect(plan.pieces).toEqual([{ id: "long", count: 5 }])
    expect(plan.decode).toEqual(["r", "short"])
  })

  it("a prompt the step's budget leaves no room for waits for the next step", () => {
    const steps = planner()
    const first = steps.plan({ prefilling: [prompt("a", 8), prompt("b", 30)], decoding: ["r"], othersDecode: true })
    expect(first.whole).toEqual(["a"])
    expect(first.pieces).toEqual([])
    const next = steps.plan({ prefilling: [prompt("b", 30)], decoding: ["r", "a"], othersDecode: true })
    expect(next.pieces).toEqual([{ id: "b", count: 8 }])
    expect(next.decode).toEqual(["r", "a"])
  })

  it("a prompt longer than the budget with nothing decoding runs whole, in one piece where prompts do not batch", () => {
    const plan = planner({ batchesPrompts: false }).plan({
      prefilling: [prompt("a", 300), prompt("b", 7)],
      decoding: [],
      othersDecode: false
    })
    expect(plan.whole).toEqual([])
    expect(plan.pieces).toEqual([
      { id: "a", count: 300 },
      { id: "b", count: 7 }
    ])
    expect(plan.decode).toEqual(["a", "b"])
  })

  it("chunkTokens 0 prefills each prompt whole even beside decoding requests", () => {
    const plan = planner({ chunkTokens: 0 }).plan({
      prefilling: [prompt("a", 300)],
      decoding: ["r"],
      othersDecode: true
    })
    expect(plan.whole).toEqual(["a"])
    expect(plan.adaptive).toBe(false)
  })

  it("a decoder that quantises per tensor prefills each prompt alone and whole, and its rows decode apart", () => {
    const plan = planner({ promptsApart: true, rowsApart: true }).plan({
      prefilling: [prompt("a", 30), prompt("b", 20)],
      decoding: ["r"],
      othersDecode: true
    })
    expect(plan).toEqual({
      whole: [],
      pieces: [
        { id: "a", count: 30 },
        { id: "b", count: 20 }
      ],
      decode: ["r", "a", "b"],
      rowsApart: true,
      adaptive: false
    })
  })
})

describe("StepPlanner: prefix reuse", () => {
  it("a prompt whose leading blocks were cached runs only the rest, as a piece over its past", () => {
    const plan = planner({ chunkTokens: 64 }).plan({
      prefilling: [prompt("hit", 50, 48), prompt("cold", 50)],
      decoding: [],
      othersDecode: false
    })
    expect(plan.whole).toEqual(["cold"])
    expect(plan.pieces).toEqual([{ id: "hit", count: 2 }])
    expect(plan.decode).toEqual(["cold", "hit"])
  })

  it("beside decoding requests, the cached positions do not count against the budget", () => {
    const plan = planner().plan({ prefilling: [prompt("hit", 60, 48)], decoding: ["r"], othersDecode: true })
    expect(plan.pieces).toEqual([{ id: "hit", count: 8 }])
    expect(plan.decode).toEqual(["r"])
  })
})

describe("StepPlanner: adaptive chunks", () => {
  const auto = () => planner({ chunkTokens: "auto" })
  const longPrompt = { prefilling: [prompt("long", 10_000)], decoding: ["r"], othersDecode: true }

  it("starts at its initial size and sizes only steps that others decode beside", () => {
    const steps = auto()
    expect(steps.chunk).toBe(chunkBounds.initial)
    expect(steps.plan(longPrompt)).toMatchObject({ pieces: [{ id: "long", count: 32 }], adaptive: true })
    expect(steps.plan({ ...longPrompt, othersDecode: false }).adaptive).toBe(false)
    expect(planner().plan(longPrompt).adaptive).toBe(false)
  })

  it("keeps its size until a decode step has been measured", () => {
    const steps = auto()
    steps.pieceTook(32, 1000)
    expect(steps.chunk).toBe(32)
  })

  it("halves at most after a slow piece and doubles at most after a fast one, toward the decode step's time", () => {
    const steps = auto()
    steps.decodeTook(10)
    steps.pieceTook(32, 15)
    // 32 × 10 / 15.
    expect(steps.chunk).toBe(21)
    steps.pieceTook(21, 1000)
    expect(steps.chunk).toBe(chunkBounds.min)
    steps.pieceTook(16, 1)
    expect(steps.chunk).toBe(32)
    steps.pieceTook(32, 0)
    expect(steps.chunk).toBe(64)
    expect(steps.plan(longPrompt).pieces).toEqual([{ id: "long", count: 64 }])
  })

  it("stays within its bounds", () => {
    const steps = auto()
    steps.decodeTook(100)
    for (let i = 0; i < 10; i++) steps.pieceTook(steps.chunk, 1)
    expect(steps.chunk).toBe(chunkBounds.max)
    for (let i = 0; i < 10; i++) steps.pieceTook(steps.chunk, 10_000)
    expect(steps.chunk).toBe(chunkBounds.min)
  })

  it("a piece shorter than the chunk (a prompt's end) says nothing of the chunk's time", () => {
    const steps = auto()
    steps.decodeTook(10)
    steps.pieceTook(5, 1000)
    expect(steps.chunk).toBe(32)
  })
})

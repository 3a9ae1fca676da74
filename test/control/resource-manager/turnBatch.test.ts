import * as Either from "effect/Either"
import { describe, expect, it } from "vitest"
import { batchedByTurn } from "../../../src/control/resource-manager/TurnBatch.js"

describe("batchedByTurn", () => {
  it("runs the keys asked for in one turn together, each with its own outcome, and later ones apart", async () => {
    const runs: Array<ReadonlyArray<string>> = []
    const ask = batchedByTurn(async (keys) => {
      runs.push(keys)
      return keys.map((key) => (key === "bad" ? Either.left({ message: `${key} failed` }) : Either.right(undefined)))
    })
    const first = [ask("a"), ask("b"), ask("a"), ask("bad")]
    const settled = await Promise.allSettled(first)
    expect(runs).toEqual([["a", "b", "bad"]])
    expect(settled.map((outcome) => outcome.status)).toEqual(["fulfilled", "fulfilled", "fulfilled", "rejected"])
    expect((settled[3] as PromiseRejectedResult).reason.message).toBe("bad failed")
    await ask("c")
    expect(runs).toEqual([["a", "b", "bad"], ["c"]])
  })

  it("fails every key of a batch whose run fails", async () => {
    const ask = batchedByTurn(() => Promise.reject(new Error("the lock is gone")))
    const settled = await Promise.allSettled([ask("a"), ask("b")])
    expect(settled.map((outcome) => (outcome as PromiseRejectedResult).reason.message)).toEqual([
      "the lock is gone",
      "the lock is gone"
    ])
  })
})

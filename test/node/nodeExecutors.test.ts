import { Effect } from "effect"
import { describe, expect, it } from "vitest"
import type { ExecutorPlacement } from "../../src/contracts/NodeRpcs.js"
import type { NodeAgent } from "../../src/node/NodeAgent.js"
import { makeNodeExecutors } from "../../src/node/NodeExecutors.js"

/**
 * What a data-plane node runs as the control plane places executors on it: executors placed on a
 * shared CPU device run side by side, and one gives way only once the control plane has said it no
 * longer holds it. The agent is a stand-in that "starts" an executor at once and counts the stops.
 */

const devices = [0, 1].map((index) => ({ id: `cpu:${index}`, type: "cpu" as const, index, threads: 2 }))

const standInAgent = (stopped: Array<string>) =>
  ({
    devices,
    startExecutor: (launch: { readonly model: string }) =>
      Effect.acquireRelease(
        Effect.succeed({ state: { _tag: "Ready", ready: `http://127.0.0.1:7000/${launch.model}` } }),
        () => Effect.sync(() => stopped.push(launch.model))
      )
  }) as unknown as NodeAgent

const placement = (id: string, taskId: string, onDevices: ReadonlyArray<string>): ExecutorPlacement => ({
  id,
  taskId,
  program: "eric",
  model: taskId,
  devices: onDevices,
  settings: { threadsPerDevice: 1, maxBatchSize: 1, maxBatchDelayMs: 2, preprocessThreads: 2 }
})

describe("NodeExecutors", () => {
  it("starts an executor on a shared CPU device beside the one there, and stops only those the control plane no longer holds", () =>
    Effect.runPromise(
      Effect.gen(function* () {
        const stopped: Array<string> = []
        const executors = makeNodeExecutors(standInAgent(stopped), {
          advertiseHost: "127.0.0.1",
          graceMs: 60_000,
          parent: yield* Effect.scope
        })
        yield* executors.start(placement("encoder-0", "encoder", ["cpu:0"]))
        yield* executors.start(placement("painter-0", "painter", ["cpu:0"]))
        expect(stopped).toEqual([])
        expect(executors.reports().map((report) => [report.id, report.state])).toEqual([
          ["encoder-0", "ready"],
          ["painter-0", "ready"]
        ])
        // The control plane holds the painter only: the encoder gives way to the next executor on cpu:0.
        yield* executors.heldBy(["painter-0"], false)
        yield* executors.start(placement("tones-0", "tones", ["cpu:0", "cpu:1"]))
        expect(stopped).toEqual(["encoder"])
        expect(executors.reports().map((report) => report.id)).toEqual(["painter-0", "tones-0"])
      }).pipe(Effect.scoped)
    ))

  it("while the control plane settles, keeps every executor it does not hold yet", () =>
    Effect.runPromise(
      Effect.gen(function* () {
        const stopped: Array<string> = []
        const executors = makeNodeExecutors(standInAgent(stopped), {
          advertiseHost: "127.0.0.1",
          graceMs: 0,
          parent: yield* Effect.scope
        })
        yield* executors.start(placement("encoder-0", "encoder", ["cpu:0"]))
        yield* executors.heldBy([], true)
        yield* executors.start(placement("painter-0", "painter", ["cpu:0"]))
        yield* executors.sweep
        expect(stopped).toEqual([])
      }).pipe(Effect.scoped)
    ))
})

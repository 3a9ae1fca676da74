import { setTimeout as sleep } from "node:timers/promises"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { type ColorChatPlatform, chatRequest, startColorChat } from "../support/colorChat.js"
import { type Outcome, outcomeOf } from "../support/colorChatRequest.js"
import { descendants } from "../support/executors.js"
import { invoke, readyWithin } from "../support/platform.js"

/**
 * Slow is not dead: an executor whose processes are alive but get no CPU (stopped with SIGSTOP,
 * as a starved event loop looks from outside, only longer) stays in rotation, and the requests
 * sent to it meanwhile wait for it and get their answers once it runs again.
 */

interface TaskRow {
  readonly id: string
  readonly executors: ReadonlyArray<{ readonly id: string; readonly healthy: boolean }>
}

/**
 * How long the executors stay stopped: several times the 750 ms of silence after which the control
 * plane used to take an executor out of rotation, well within the 30 s after which it is wedged.
 */
const stallMs = 5_000
/** How often a request is sent while they are stopped. */
const sendEveryMs = 500

describe("cornserve serve: an executor stopped for seconds keeps its requests", () => {
  let running: ColorChatPlatform

  beforeAll(async () => {
    running = await startColorChat(`slow-${process.pid}`)
  }, readyWithin(3))

  afterAll(async () => {
    expect(await running?.dispose()).toBe(0)
  })

  const tasks = async () =>
    ((await (await fetch(`${running.platform.url}/tasks/list`)).json()) as { tasks: Array<TaskRow> }).tasks

  it("answers every request sent while its executors' processes were stopped, once they run again", async () => {
    const { url, process: serve } = running.platform
    const ask = async () => outcomeOf(await invoke(url, "color_chat", chatRequest))
    expect(await ask()).toEqual({ text: "red" })

    // Every executor of color_chat: its routers (with their engines) and workers.
    const executorProcesses = descendants(serve.pid!).filter((entry) =>
      / internal executor(-worker)? /.test(entry.command)
    )
    const kinds = new Set(executorProcesses.map((entry) => / internal (\S+) /.exec(entry.command)![1]))
    expect(kinds).toEqual(new Set(["executor", "executor-worker"]))

    const settled: Array<Outcome> = []
    const pending: Array<Promise<Outcome>> = []
    for (const { pid } of executorProcesses) process.kill(pid, "SIGSTOP")
    try {
      for (let sent = 0; sent < stallMs / sendEveryMs; sent++) {
        pending.push(
          ask().then((outcome) => {
            settled.push(outcome)
            return outcome
          })
        )
        await sleep(sendEveryMs)
      }
      // Still in rotation after seconds of silence, and no request was refused meanwhile.
      const executors = (await tasks()).flatMap((task) => task.executors)
      expect(executors.length).toBeGreaterThanOrEqual(2)
      expect(executors.filter((executor) => !executor.healthy)).toEqual([])
      expect(settled).toEqual([])
    } finally {
      for (const { pid } of executorProcesses) process.kill(pid, "SIGCONT")
    }
    const outcomes = await Promise.all(pending)
    expect(outcomes).toEqual(pending.map(() => ({ text: "red" })))
    // The same executors answered: none was restarted for being slow.
    expect(running.platform.output()).not.toMatch(/restarting it/)
  })
})

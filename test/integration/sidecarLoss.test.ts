import { existsSync } from "node:fs"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { arenaFilePrefix } from "../../src/sidecar/Arena.js"
import { type ColorChatPlatform, colorChatLoad, startColorChat } from "../support/colorChat.js"
import { descendants } from "../support/executors.js"
import { eventually } from "../support/platform.js"

const nodeId = `sidecar-loss-${process.pid}`

describe("cornserve serve: the sidecar killed with SIGKILL under load", () => {
  let running: ColorChatPlatform

  beforeAll(async () => {
    running = await startColorChat(nodeId)
  })

  afterAll(async () => {
    await running?.dispose()
  })

  it("fails only the requests it held, as 503 with Retry-After; executors reconnect; its arena is removed", async () => {
    const tree = () => descendants(running.platform.process.pid!)
    const executorPids = () =>
      tree()
        .filter((entry) => entry.command.includes(" internal executor"))
        .map((entry) => entry.pid)
        .sort()
    const load = colorChatLoad(running.platform.url, 4)
    await eventually(async () => (load.answers.some((answer) => answer.status === 200) ? true : undefined), 60_000)
    const executorsBefore = executorPids()
    const sidecar = tree().find((entry) => entry.command.includes(" internal sidecar "))!
    const arena = join("/dev/shm", `${arenaFilePrefix}${nodeId}-${sidecar.pid}`)
    expect(existsSync(arena)).toBe(true)

    const killedAt = Date.now()
    process.kill(sidecar.pid, "SIGKILL")
    // A bound for liveness only: on a busy machine the restart and the executors' reconnection take
    // seconds, and how many seconds is the host's business, not this test's.
    const servedAgain = await eventually(
      async () => load.answers.find((answer) => answer.startedAt > killedAt && answer.status === 200),
      60_000
    ).catch(() => undefined)
    expect(servedAgain, "a request started after the kill succeeded").toBeDefined()
    await load.stop()

    const failures = load.answers.filter((answer) => answer.status !== 200)
    for (const failure of failures) {
      expect(failure.status, failure.body).toBe(503)
      expect(failure.retryAfter, failure.body).not.toBeNull()
    }
    expect(executorPids()).toEqual(executorsBefore)
    expect(existsSync(arena)).toBe(false)
  })
})

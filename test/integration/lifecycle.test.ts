import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { invoke, removeStateDir, repoRoot, runCli, type RunningPlatform, startPlatform } from "../support/platform.js"

describe("cornserve serve: an app's worker that dies is restarted", () => {
  let platform: RunningPlatform

  beforeAll(async () => {
    platform = await startPlatform({ args: ["--devices", "cpu:0"] })
    const registered = await runCli(["app", "register", join(repoRoot, "test", "fixtures", "apps", "crashing.ts")], {
      CORNSERVE_GATEWAY_URL: platform.url
    })
    expect(registered.code, registered.stderr).toBe(0)
  })

  afterAll(async () => {
    const code = await platform?.stop()
    expect(code).toBe(0)
    await removeStateDir(platform.stateDir)
  })

  it("waits longer before each restart of a worker that dies at once, and the app then answers", async () => {
    for (let crash = 0; crash < 4; crash++) {
      const response = await invoke(platform.url, "crashing", JSON.stringify({ crash: true }))
      expect(response.ok).toBe(false)
      const { error } = (await response.json()) as { error: { message: string } }
      expect(error.message).toContain("the app's worker stopped (exit code 3)")
    }
    const answer = await invoke(platform.url, "crashing", JSON.stringify({ crash: false }))
    expect(await answer.json()).toEqual({ ok: true })
    const waits = [...platform.output().matchAll(/app crashing: restarting its worker in (\d+) ms/g)].map((match) =>
      Number(match[1])
    )
    expect(waits).toEqual([250, 500, 1_000, 2_000])
  })
})

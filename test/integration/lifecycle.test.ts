import { existsSync } from "node:fs"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { arenaFilePrefix } from "../../src/sidecar/Arena.js"
import { type ColorChatPlatform, chatRequest, colorChatArenaBytes, startColorChat } from "../support/colorChat.js"
import { descendants } from "../support/executors.js"
import {
  adminHeaders,
  eventually,
  invoke,
  removeStateDir,
  repoRoot,
  runCli,
  type RunningPlatform,
  startPlatform
} from "../support/platform.js"

const nodeId = `lifecycle-${process.pid}`
const arenaBytes = colorChatArenaBytes
const arenaFileOf = (sidecarPid: number) => join("/dev/shm", `${arenaFilePrefix}${nodeId}-${sidecarPid}`)

describe("cornserve serve: the node's sidecar is restarted, and the control plane follows it", () => {
  let running: ColorChatPlatform
  let platform: RunningPlatform
  let env: Record<string, string>

  /** The sidecar processes the platform runs. */
  const sidecars = () =>
    descendants(platform.process.pid!).filter((entry) => entry.command.includes(" internal sidecar "))

  /** The sidecar's section of /metrics, or undefined when it has none. */
  const sidecarMetrics = async () => {
    const text = await (await fetch(`${platform.url}/metrics`, { headers: adminHeaders() })).text()
    const sample = (name: string) => {
      const match = new RegExp(`^${name}\\{node="${nodeId}"\\} (\\d+)$`, "m").exec(text)
      return match === null ? undefined : Number(match[1])
    }
    const arena = sample("cornserve_sidecar_arena_bytes")
    if (arena === undefined) return undefined
    return {
      arenaBytes: arena,
      bytesInUse: sample("cornserve_sidecar_bytes_in_use"),
      transfersActive: sample("cornserve_sidecar_transfers_active")
    }
  }

  const colourOfRedPixel = async () => {
    const result = await runCli(
      ["app", "invoke", "color_chat", "--aggregate", "choices.0.delta.content", "--data", chatRequest],
      env
    )
    return result.code === 0 ? result.stdout.trim() : undefined
  }

  beforeAll(async () => {
    running = await startColorChat(nodeId, ["--request-timeout", "60"])
    platform = running.platform
    env = { CORNSERVE_GATEWAY_URL: platform.url }
  })

  afterAll(async () => {
    expect(await running?.dispose()).toBe(0)
  })

  it("runs one sidecar; once it is killed, a new one runs, /metrics shows its arena and the old arena is removed", async () => {
    const before = sidecars()
    expect(before).toHaveLength(1)
    expect(await sidecarMetrics()).toMatchObject({ arenaBytes })
    const killed = before[0]!.pid
    expect(existsSync(arenaFileOf(killed))).toBe(true)

    process.kill(killed, "SIGKILL")

    const restarted = await eventually(async () => {
      const now = sidecars()
      return now.length === 1 && now[0]!.pid !== killed ? now[0]! : undefined
    })
    expect(await eventually(sidecarMetrics)).toMatchObject({ arenaBytes })
    expect(existsSync(arenaFileOf(killed))).toBe(false)
    expect(existsSync(arenaFileOf(restarted.pid))).toBe(true)
  })

  it("serves requests through the new sidecar", async () => {
    expect(await eventually(colourOfRedPixel, 60_000)).toBe("red")
  })

  it("counts no transfer as active once the requests that made them have ended", async () => {
    for (let request = 0; request < 3; request++) expect(await colourOfRedPixel()).toBe("red")
    expect(await eventually(async () => ((await sidecarMetrics())?.transfersActive === 0 ? true : undefined))).toBe(
      true
    )
  })

  it("measures each executor call, and the LLM stream's first token and the gaps between tokens, in /metrics", async () => {
    expect(await colourOfRedPixel()).toBe("red")
    const text = await (await fetch(`${platform.url}/metrics`, { headers: adminHeaders() })).text()
    expect(text).toMatch(
      /^cornserve_executor_call_seconds_count\{task="encoder-[^"]+",operation="[^"]+",outcome="ok"\} [1-9]/m
    )
    expect(text).toMatch(
      /^cornserve_executor_call_seconds_count\{task="llm-[^"]+",operation="[^"]+",outcome="ok"\} [1-9]/m
    )
    expect(text).toMatch(/^cornserve_stream_first_chunk_seconds_count\{task="llm-[^"]+"\} [1-9]/m)
    expect(text).toMatch(/^cornserve_stream_inter_chunk_seconds_count\{task="llm-[^"]+"\} [1-9]/m)
    expect(text).toMatch(/^cornserve_request_duration_seconds_count\{app="color_chat",status="200"\} [1-9]/m)
    // Per hop: the app's own code, the dispatcher's share, the platform's overhead, leases, the sidecar.
    for (const family of [
      "cornserve_request_overhead_seconds",
      "cornserve_app_code_seconds",
      "cornserve_dispatch_overhead_seconds"
    ]) {
      expect(text).toMatch(new RegExp(`^${family}_count\\{app="color_chat"\\} [1-9]`, "m"))
    }
    expect(text).toMatch(/^cornserve_task_lease_wait_seconds_count\{task="encoder-[^"]+"\} [1-9]/m)
    expect(text).toMatch(/^cornserve_task_lease_wait_seconds_count\{task="llm-[^"]+"\} [1-9]/m)
    expect(text).toMatch(/^cornserve_sidecar_transfer_seconds_count\{node="[^"]+"\} [1-9]/m)
    expect(text).toMatch(/^cornserve_sidecar_transfer_seconds_bucket\{node="[^"]+",le="\+Inf"\} [1-9]/m)
    expect(text).toMatch(/^cornserve_sidecar_transferred_bytes_total\{node="[^"]+"\} [1-9]/m)
    expect(text).toMatch(/^# TYPE cornserve_dispatch_retries_total counter/m)
    expect(text).toMatch(/^cornserve_task_calls_shed_total\{task="llm-[^"]+"\} 0/m)
    expect(text).toMatch(/^cornserve_requests_shed_total|^# TYPE cornserve_requests_shed_total counter/m)
  })

  it("releases from the new sidecar the data a cancelled request left there", async () => {
    expect(await sidecarMetrics()).toMatchObject({ bytesInUse: 0 })
    // With the LLM executor stopped, the image's embeddings wait in the arena for a reader that
    // never comes: only the release of the cancelled request frees them before the sidecar's TTL.
    const router = descendants(platform.process.pid!).find(
      (entry) => entry.command.includes(" internal executor ") && entry.command.includes("--kind llm")
    )
    expect(router).toBeDefined()
    const llm = [router!, ...descendants(router!.pid)]
    for (const { pid } of llm) process.kill(pid, "SIGSTOP")
    try {
      const controller = new AbortController()
      const pending = fetch(`${platform.url}/app/invoke/color_chat`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: chatRequest,
        signal: controller.signal
      }).catch(() => undefined)
      await eventually(async () => (((await sidecarMetrics())?.bytesInUse ?? 0) > 0 ? true : undefined))
      controller.abort()
      await pending
      expect(await eventually(async () => ((await sidecarMetrics())?.bytesInUse === 0 ? true : undefined))).toBe(true)
    } finally {
      for (const { pid } of llm) process.kill(pid, "SIGCONT")
    }
  })
})

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
    // Each crash's restart waits twice the one before. On a busy host the watchdog may also restart a
    // worker that took longer than the stall timeout to load: a later restart, not one of these.
    expect(waits.slice(0, 4)).toEqual([250, 500, 1_000, 2_000])
  })
})

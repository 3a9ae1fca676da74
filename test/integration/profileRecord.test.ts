import { mkdtemp, readFile, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import {
  adminHeaders,
  appReady,
  eventually,
  makeStateDir,
  readyWithin,
  removeStateDir,
  repoRoot,
  type RunningPlatform,
  runCli,
  startPlatform
} from "../support/platform.js"

/**
 * `cornserve tasks profile ID --record` on the real binary: the platform drives a short load sweep
 * against an LLM task's and an encoder task's executors with synthetic calls, keeps each recorded
 * curve in the state dir, shows it with the task's profile, and again after a restart.
 */

interface TaskRow {
  readonly id: string
  readonly name: string
}

interface CurvePoint {
  readonly levelFrom: number
  readonly levelTo: number
  readonly calls: number
  readonly p50Ms: number
}

interface Recorded {
  readonly recordedAt: string
  readonly levels: ReadonlyArray<number>
  readonly secondsPerLevel: number
  readonly calls: number
  readonly curves: ReadonlyArray<{ readonly executors: number; readonly points: ReadonlyArray<CurvePoint> }>
}

interface ProfileAnswer {
  readonly taskId: string
  readonly calls: number
  readonly recorded: Recorded | null
}

describe("cornserve tasks profile --record: a load sweep recorded ahead of time, kept across restarts", () => {
  let platform: RunningPlatform
  let stateDir: string
  let modelDir: string
  let llmId = ""
  let encoderId = ""

  /** color_chat's executors: its image encoder's, its audio encoder's and its LLM's. */
  const executors = 3
  /** The platform, and once color_chat is registered, color_chat brought back and ready. */
  const start = () =>
    startPlatform({
      args: ["--devices", "cpu:0,cpu:1,cpu:2"],
      env: { CORNSERVE_MODEL_DIR: modelDir },
      stateDir,
      ...(llmId === "" ? {} : { ready: ({ url }) => appReady(url, "color_chat", executors) })
    })
  const cli = (args: ReadonlyArray<string>) => runCli(args, { CORNSERVE_GATEWAY_URL: platform.url })
  const profileOf = async (taskId: string) =>
    (await (await fetch(`${platform.url}/tasks/${taskId}/profile`)).json()) as ProfileAnswer
  const record = (taskId: string, body: unknown) =>
    fetch(`${platform.url}/tasks/${taskId}/profile/record`, {
      method: "POST",
      headers: adminHeaders({ "content-type": "application/json" }),
      body: JSON.stringify(body)
    })
  /** Each point of the curve at one executor: its load group and whether it measured calls. */
  const pointsOf = (recorded: Recorded | null) =>
    recorded?.curves
      .find((curve) => curve.executors === 1)
      ?.points.map((point) => ({ load: point.levelTo, measured: point.calls > 0 && point.p50Ms > 0 }))

  beforeAll(async () => {
    stateDir = await makeStateDir()
    modelDir = await mkdtemp(join(tmpdir(), "cornserve-models-"))
    platform = await start()
    const registered = await cli(["app", "register", join(repoRoot, "examples", "color_chat.ts")])
    expect(registered.code, registered.stderr).toBe(0)
    const { tasks } = (await (await fetch(`${platform.url}/tasks/list`)).json()) as { tasks: Array<TaskRow> }
    llmId = tasks.find((task) => task.name.startsWith("llm"))!.id
    encoderId = tasks.find((task) => task.name.startsWith("encoder-image"))!.id
  }, readyWithin(executors))

  afterAll(async () => {
    await platform?.stop()
    await removeStateDir(stateDir)
    await rm(modelDir, { recursive: true, force: true })
  })

  it("records an LLM task's curve from chat calls, tells each level, and keeps it in the state dir", async () => {
    const recorded = await cli(["tasks", "profile", llmId, "--record", "--levels", "1,2", "--seconds-per-level", "1"])
    expect(recorded.code, recorded.stderr).toBe(0)
    expect(recorded.stderr).toMatch(/^ {2}load 1 \(1 executor\(s\)\): [1-9]\d* call\(s\), \d+ failed in /m)
    expect(recorded.stderr).toMatch(/^ {2}load 2 \(1 executor\(s\)\): [1-9]\d* call\(s\), \d+ failed in /m)
    expect(recorded.stdout).toMatch(
      /^recorded \S+ \(load 1, 2; 1 s each\): \d+ call\(s\), \d+ failed\nEXECUTORS\s+LOAD\s+CALLS\s+P50 MS\s+P95 MS\s+P99 MS\s+CALLS\/S\n1\s+1\s+[1-9]/
    )

    const profile = await profileOf(llmId)
    expect(profile.recorded).toMatchObject({ levels: [1, 2], secondsPerLevel: 1 })
    expect(pointsOf(profile.recorded)).toEqual([
      { load: 1, measured: true },
      { load: 2, measured: true }
    ])
    // The platform's own calls are not the task's: its measured profile counts none of them.
    expect(profile.calls).toBe(0)
    const stored = JSON.parse(await readFile(join(stateDir, "profiles", `${llmId}.json`), "utf8")) as Recorded
    expect(stored).toEqual(profile.recorded)
  })

  it("records an encoder task's curve from generated images, taking their embeddings out of the sidecar", async () => {
    const recorded = await cli([
      "tasks",
      "profile",
      encoderId,
      "--record",
      "--levels",
      "1,2",
      "--seconds-per-level",
      "1",
      "--json"
    ])
    expect(recorded.code, recorded.stderr).toBe(0)
    const printed = JSON.parse(recorded.stdout) as Recorded
    expect(pointsOf(printed)).toEqual([
      { load: 1, measured: true },
      { load: 2, measured: true }
    ])
    expect((await profileOf(encoderId)).recorded).toEqual(printed)
    expect(JSON.parse(await readFile(join(stateDir, "profiles", `${encoderId}.json`), "utf8"))).toEqual(printed)
    await eventually(async () => {
      const metrics = await (await fetch(`${platform.url}/metrics`, { headers: adminHeaders() })).text()
      return /^cornserve_sidecar_bytes_in_use\{[^}]*\} 0$/m.test(metrics) ? true : undefined
    })
  })

  it("refuses an unknown task (404), a second recording of a task being recorded (409), and misused flags", async () => {
    const unknown = await record("llm-nonexistent", { levels: [1], secondsPerLevel: 1 })
    expect(unknown.status).toBe(404)
    expect(((await unknown.json()) as { error: { code: string } }).error.code).toBe("TaskNotFound")
    const unknownByCli = await cli(["tasks", "profile", "llm-nonexistent", "--record"])
    expect(unknownByCli.code).not.toBe(0)
    expect(unknownByCli.stderr).toMatch(/no task "llm-nonexistent" is deployed/)

    const first = await record(encoderId, { levels: [1], secondsPerLevel: 2 })
    expect(first.status).toBe(200)
    const second = await record(encoderId, { levels: [1], secondsPerLevel: 1 })
    expect(second.status).toBe(409)
    expect(((await second.json()) as { error: { code: string } }).error.code).toBe("RecordingInProgress")
    expect(await first.text()).toMatch(/^event: final$/m)

    const misused = await cli(["tasks", "profile", encoderId, "--levels", "1,2"])
    expect(misused.code).toBe(2)
    expect(misused.stderr).toMatch(/--levels and --seconds-per-level go with --record/)
  })

  it(
    "shows the recorded curves with the task's profile after a restart",
    async () => {
      const before = (await profileOf(llmId)).recorded!
      expect(await platform.stop()).toBe(0)
      platform = await start()
      expect((await profileOf(llmId)).recorded).toEqual(before)
      // The encoder's latest recording: the one the second was refused beside.
      expect((await profileOf(encoderId)).recorded).toMatchObject({ levels: [1], secondsPerLevel: 2 })

      const shown = await cli(["tasks", "profile", llmId])
      expect(shown.code, shown.stderr).toBe(0)
      expect(shown.stdout).toMatch(
        new RegExp(`^task ${llmId} \\(llm-tiny-color-vlm, llm\\): 1 executor\\(s\\); 0 call\\(s\\)`)
      )
      expect(shown.stdout).toContain(`\nrecorded ${before.recordedAt} (load 1, 2; 1 s each): ${before.calls} call(s)`)
    },
    readyWithin(executors)
  )
})

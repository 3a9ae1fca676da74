import { mkdtemp, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { invoke, removeStateDir, repoRoot, runCli, type RunningPlatform, startPlatform } from "./platform.js"

import { chatRequest } from "./colorChatRequest.js"

export { chatRequest }

export interface ColorChatPlatform {
  readonly platform: RunningPlatform
  /** Stops the platform (unless it is gone already), removes its directories, and gives its exit code. */
  readonly dispose: () => Promise<number | null>
}

/** The sidecar arena of a platform `startColorChat` starts. */
export const colorChatArenaBytes = 64 * 1024 * 1024

/** `cornserve serve` on three CPU devices (and any further `args`, `env`) with color_chat registered and ready. */
export const startColorChat = async (
  nodeId: string,
  args: ReadonlyArray<string> = [],
  env: Readonly<Record<string, string>> = {}
): Promise<ColorChatPlatform> => {
  const modelDir = await mkdtemp(join(tmpdir(), "cornserve-models-"))
  const platform = await startPlatform({
    args: [
      "--devices",
      "cpu:0,cpu:1,cpu:2",
      "--node-id",
      nodeId,
      "--sidecar-arena-bytes",
      String(colorChatArenaBytes),
      ...args
    ],
    env: { ...env, CORNSERVE_MODEL_DIR: modelDir },
    ready: async ({ url }) => {
      const registered = await runCli(["app", "register", join(repoRoot, "examples", "color_chat.ts")], {
        CORNSERVE_GATEWAY_URL: url
      })
      if (registered.code !== 0) throw new Error(`color_chat was not registered: ${registered.stderr}`)
    }
  }).catch(async (error: unknown) => {
    await rm(modelDir, { recursive: true, force: true })
    throw error
  })
  return {
    platform,
    dispose: async () => {
      const code = await platform.stop()
      await removeStateDir(platform.stateDir)
      await rm(modelDir, { recursive: true, force: true })
      return code
    }
  }
}

export interface Answer {
  readonly startedAt: number
  readonly endedAt: number
  /** 0 when no HTTP answer came. */
  readonly status: number
  readonly retryAfter: string | null
  readonly body: string
}

/** `clients` concurrent clients, each invoking color_chat in a loop until `stop` is called. */
export const colorChatLoad = (url: string, clients: number) => {
  const answers: Array<Answer> = []
  let stopped = false
  const client = async () => {
    while (!stopped) {
      const startedAt = Date.now()
      try {
        const response = await invoke(url, "color_chat", chatRequest)
        const body = await response.text()
        answers.push({
          startedAt,
          endedAt: Date.now(),
          status: response.status,
          retryAfter: response.headers.get("retry-after"),
          body
        })
      } catch (error) {
        answers.push({ startedAt, endedAt: Date.now(), status: 0, retryAfter: null, body: String(error) })
      }
    }
  }
  const running = Array.from({ length: clients }, client)
  return {
    answers,
    stop: async () => {
      stopped = true
      await Promise.all(running)
    }
  }
}

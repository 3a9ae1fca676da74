import { createServer } from "node:net"
import { mkdtemp, readdir, rm } from "node:fs/promises"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import { runCli, startPlatform } from "../support/platform.js"

describe("the CLI as a person meets it", () => {
  const dirs: Array<string> = []
  afterAll(async () => {
    for (const dir of dirs) await rm(dir, { recursive: true, force: true })
  })

  it("writes help into a pipe without terminal escapes or generic type lines, and lists every command", async () => {
    const root = await runCli(["--help"])
    expect(root.code).toBe(0)
    expect(root.stdout).not.toContain("\u001b[")
    expect(root.stdout).not.toContain("A user-defined piece of text.")
    for (const command of [
      "serve",
      "app register",
      "app dev",
      "app logs",
      "tasks scale",
      "models build",
      "models pull"
    ]) {
      expect(root.stdout, command).toContain(`  - ${command}`)
    }
    const unregister = await runCli(["app", "unregister", "--help"])
    expect(unregister.stdout).toContain("The app's id, as app list shows it.")
    expect(unregister.stdout).not.toContain("A user-defined piece of text.")
  })

  it("says that a port is taken, and by whom it may be", async () => {
    const squatter = createServer()
    await new Promise<void>((resolve) => squatter.listen(0, "127.0.0.1", resolve))
    const port = (squatter.address() as { port: number }).port
    const stateDir = await mkdtemp(join(tmpdir(), "cornserve-port-"))
    dirs.push(stateDir)
    try {
      const result = await runCli(["serve", "--port", String(port), "--state-dir", stateDir])
      expect(result.code).toBe(1)
      expect(result.stderr).toContain(
        `cornserve: cannot listen on 127.0.0.1:${port}: the port is taken by another program (another cornserve?)`
      )
    } finally {
      await new Promise((resolve) => squatter.close(resolve))
    }
  }, 60_000)

  it("refuses a second platform on a state dir another one serves from", async () => {
    const platform = await startPlatform({ args: ["--devices", "cpu:0"] })
    try {
      const second = await runCli(["serve", "--port", "0", "--state-dir", platform.stateDir])
      expect(second.code).toBe(1)
      expect(second.stderr).toContain(`another cornserve (pid ${platform.process.pid}) serves from the state dir`)
    } finally {
      await platform.stop()
    }
    // Once it is gone, the directory is free again.
    const after = await startPlatform({ stateDir: platform.stateDir, args: ["--devices", "cpu:0"] })
    await after.stop()
    dirs.push(platform.stateDir)
  }, 60_000)

  it("refuses a misspelt built-in model by name, suggesting the closest, and leaves no directory behind", async () => {
    const dir = await mkdtemp(join(tmpdir(), "cornserve-models-"))
    dirs.push(dir)
    const result = await runCli(["models", "pull", "cornserve/tiny-colour-vlm", "--dir", dir], {
      HF_ENDPOINT: "http://127.0.0.1:9"
    })
    expect(result.code).toBe(1)
    expect(result.stderr).toContain("did you mean cornserve/tiny-color-vlm?")
    expect(await readdir(dir)).toEqual([])
    // A hub id whose download fails leaves nothing behind either.
    const unreachable = await runCli(["models", "pull", "someone/no-such-model", "--dir", dir], {
      HF_ENDPOINT: "http://127.0.0.1:9"
    })
    expect(unreachable.code).toBe(1)
    expect(await readdir(dir)).toEqual([])
  })
})

import { existsSync, mkdirSync, readFileSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { afterEach, describe, expect, it } from "vitest"
import { standaloneRunDirPrefix } from "../../src/executors/common/ExecutorConfig.js"
import { removeAbandonedFiles, runDirPrefix } from "../../src/node/AbandonedFiles.js"

/**
 * What a platform removes as it starts: directories in the temporary directory whose owner, named
 * by the pid in their name, is gone; never those of a process that runs.
 */

// No process can have the kernel's pid limit as its pid: pids stay below it.
const gonePid = Number(readFileSync("/proc/sys/kernel/pid_max", "utf8").trim())

const made: Array<string> = []
const makeDir = (name: string) => {
  const path = join(tmpdir(), name)
  mkdirSync(join(path, "media"), { recursive: true })
  made.push(path)
  return path
}

afterEach(() => {
  for (const path of made.splice(0)) rmSync(path, { recursive: true, force: true })
})

describe("abandoned run directories", () => {
  it("removes an executor's socket directory and a node agent's run directory once their owners are gone", () => {
    const executorDir = makeDir(`${standaloneRunDirPrefix}${gonePid}`)
    const nodeDir = makeDir(`${runDirPrefix}${gonePid}-abandoned`)
    removeAbandonedFiles()
    expect(existsSync(executorDir)).toBe(false)
    expect(existsSync(nodeDir)).toBe(false)
  })

  it("keeps those of a running process, and names that only look alike", () => {
    const running = makeDir(`${standaloneRunDirPrefix}${process.pid}`)
    const runningNode = makeDir(`${runDirPrefix}${process.pid}-live`)
    const lookalike = makeDir(`${standaloneRunDirPrefix}${gonePid}-copy`)
    removeAbandonedFiles()
    expect(existsSync(running)).toBe(true)
    expect(existsSync(runningNode)).toBe(true)
    expect(existsSync(lookalike)).toBe(true)
  })
})

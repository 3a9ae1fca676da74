import { mkdirSync, readFileSync, rmSync, writeFileSync } from "node:fs"
import { join } from "node:path"

/**
 * One `serve` per state dir: two platforms on one directory would restore the same apps, hold the
 * same tasks and overwrite each other's files. The lock is a file holding the pid of the process
 * that serves from the directory, made exclusively; one left by a process that is gone is taken
 * over. Answers the release, or why the directory is taken.
 */
export const lockStateDir = (stateDir: string): (() => void) | string => {
  mkdirSync(stateDir, { recursive: true, mode: 0o700 })
  const path = join(stateDir, "serve.pid")
  for (let attempt = 0; attempt < 2; attempt++) {
    try {
      writeFileSync(path, `${process.pid}\n`, { flag: "wx", mode: 0o600 })
      return () => {
        if (holder(path) === process.pid) rmSync(path, { force: true })
      }
    } catch (error) {
      if ((error as NodeJS.ErrnoException).code !== "EEXIST") {
        return `cannot lock the state dir ${stateDir}: ${(error as Error).message}`
      }
      const pid = holder(path)
      if (pid !== undefined && pid !== process.pid && alive(pid)) {
        return `another cornserve (pid ${pid}) serves from the state dir ${stateDir}; stop it first, or give this one its own --state-dir`
      }
      // Left by a process that is gone (killed, crashed): taken over.
      rmSync(path, { force: true })
    }
  }
  return `cannot lock the state dir ${stateDir}: ${path} keeps coming back`
}

const holder = (path: string): number | undefined => {
  try {
    const pid = Number(readFileSync(path, "utf8").trim())
    return Number.isSafeInteger(pid) && pid > 0 ? pid : undefined
  } catch {
    return undefined
  }
}

const alive = (pid: number): boolean => {
  try {
    process.kill(pid, 0)
    return true
  } catch (error) {
    // EPERM: it exists, as another user's.
    return (error as NodeJS.ErrnoException).code === "EPERM"
  }
}

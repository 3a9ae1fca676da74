/**
 * Files that Cornserve processes killed with SIGKILL could not remove: node agents' run
 * directories, the socket directories of executors started by hand, sidecars' arenas and executor
 * engines' batch buffers. Each name ends with the pid
 * of the process that owns it; a file is abandoned once that process is gone. Files of running
 * processes are never touched: other platforms may run on the same machine.
 */
import { readdirSync, rmSync } from "node:fs"
import { tmpdir } from "node:os"
import { join } from "node:path"
import { batchBufferPrefix } from "../executors/common/BatchBuffer.js"
import { standaloneRunDirPrefix } from "../executors/common/ExecutorConfig.js"
import { isRunning } from "../process/Pids.js"
import { arenaFilePrefix } from "../sidecar/Arena.js"

/** Every node agent's run directory: `cornserve-node-<pid>-<random>` in the temporary directory. */
export const runDirPrefix = "cornserve-node-"

const sharedMemoryDir = "/dev/shm"

export { isRunning } from "../process/Pids.js"

const removeAbandoned = (dir: string, ownerOf: (name: string) => number | undefined) => {
  let names: ReadonlyArray<string>
  try {
    names = readdirSync(dir)
  } catch {
    return
  }
  for (const name of names) {
    const pid = ownerOf(name)
    if (pid !== undefined && Number.isSafeInteger(pid) && pid > 0 && !isRunning(pid))
      rmSync(join(dir, name), { recursive: true, force: true })
  }
}

/** `<prefix>...-<pid>`: arena files are `cornserve-arena-<node id>-<pid>`, batch buffers `cornserve-batches-<pid>`. */
const trailingPid = (name: string) => {
  if (!name.startsWith(arenaFilePrefix) && !name.startsWith(batchBufferPrefix)) return undefined
  const match = /-(\d+)$/.exec(name)
  return match === null ? undefined : Number(match[1])
}

const runDirOwner = (name: string) => {
  const match =
    new RegExp(`^${runDirPrefix}(\\d+)-`).exec(name) ?? new RegExp(`^${standaloneRunDirPrefix}(\\d+)$`).exec(name)
  return match === null ? undefined : Number(match[1])
}

export const removeAbandonedFiles = (): void => {
  removeAbandoned(tmpdir(), runDirOwner)
  removeAbandoned(sharedMemoryDir, trailingPid)
}

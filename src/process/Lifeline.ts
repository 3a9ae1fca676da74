/**
 * How a process Cornserve starts stops when the process that started it dies, however it dies.
 * The parent holds the write end of a pipe on the child's stdin and never writes to it; the kernel
 * closes it when the parent exits, SIGKILL included, and the child sees its stdin end at once.
 * The parent says so in the child's environment: a child whose stdin is a terminal, /dev/null or
 * someone's pipe (started by hand, or by a test) watches its parent's pid instead.
 */

const lifelineEnvName = "CORNSERVE_LIFELINE"

/**
 * Whether a Cornserve process started this one and holds its lifeline: read once, as the process
 * starts, since `exitWithParent` takes the marker out of the environment.
 */
export const startedWithLifeline: boolean = process.env[lifelineEnvName] === "stdin"

/** How often a child without a lifeline checks whether its parent is still there. */
const parentCheckIntervalMs = 500

/**
 * How long a child whose parent is gone may take to stop cleanly (removing its shared-memory files,
 * stopping its own children) before it exits anyway. The graces add up down a tree (agent, router,
 * worker each wait for their parent to be gone), and a whole tree must be gone within 2 s even on a
 * loaded machine; what a cut-short cleanup leaves, the next start removes.
 */
const stopGraceMs = 400

/** The environment of a child spawned with `stdio[0]: "pipe"`, which makes that pipe its lifeline. */
export const lifelineEnv = (env: Readonly<Record<string, string | undefined>>) => ({
  ...env,
  [lifelineEnvName]: "stdin"
})

/**
 * In a child: stops this process when its parent is gone. Stopping is what SIGTERM does (the
 * command's scope closes and its finalizers run), bounded by `stopGraceMs`.
 */
export const exitWithParent = (): void => {
  const hasLifeline = startedWithLifeline
  // The marker is this process's alone: its own children get theirs from whoever spawns them.
  delete process.env[lifelineEnvName]
  const parent = process.ppid
  let stopping = false
  const stop = () => {
    if (stopping) return
    stopping = true
    clearInterval(parentCheck)
    console.error(`cornserve: the process that started this one (pid ${parent}) is gone; stopping`)
    setTimeout(() => process.exit(1), stopGraceMs).unref()
    process.kill(process.pid, "SIGTERM")
  }
  const parentCheck = hasLifeline
    ? undefined
    : setInterval(() => {
        if (process.ppid !== parent) stop()
      }, parentCheckIntervalMs).unref()
  if (hasLifeline) {
    process.stdin.on("data", () => undefined)
    process.stdin.once("end", stop)
    process.stdin.once("close", stop)
  }
}

/**
 * Which signals stop a Cornserve process, and whether its stop has begun.
 *
 * A terminal's Ctrl-C sends SIGINT to its whole foreground process group: the platform's main
 * process and, at the same moment, every sidecar, executor and app process it started. The stop is
 * the main process's to order: the gateway first lets the requests in flight finish (within
 * `--shutdown-grace`), and only then are apps, executors and sidecars stopped, each by its parent
 * (SIGTERM, or its lifeline closing). So a process that a Cornserve process started ignores SIGINT;
 * SIGTERM stops it, as it stops the main process. Started by hand, any Cornserve command stops on
 * either.
 */
import { makeRunMain } from "@effect/platform/Runtime"
import { constVoid } from "effect/Function"
import { startedWithLifeline } from "./Lifeline.js"

let stopBegun = false

/**
 * Whether this process has been told to stop (a signal it stops on has arrived). From then on what
 * it supervises is not restarted, whatever its exit: it is the stop itself, or a part of it.
 */
export const stopHasBegun = (): boolean => stopBegun

const stopSignals: ReadonlyArray<NodeJS.Signals> = startedWithLifeline ? ["SIGTERM"] : ["SIGINT", "SIGTERM"]

/**
 * `NodeRuntime.runMain` with the signals above: the first one interrupts the command's fiber (its
 * scope closes and its finalizers run); a second one, once the first was taken, ends the process
 * at once, as the default action of the signal does.
 */
export const runMain = makeRunMain(({ fiber, teardown }) => {
  const keepAlive = setInterval(constVoid, 2 ** 31 - 1)
  let receivedSignal = false
  const removeListeners = () => {
    for (const signal of stopSignals) process.removeListener(signal, onSignal)
  }
  const onSignal = () => {
    receivedSignal = true
    stopBegun = true
    removeListeners()
    fiber.unsafeInterruptAsFork(fiber.id())
  }
  // Never removed: the group's SIGINT must not end this process even while it stops.
  if (startedWithLifeline) process.on("SIGINT", constVoid)
  for (const signal of stopSignals) process.on(signal, onSignal)
  fiber.addObserver((exit) => {
    if (!receivedSignal) removeListeners()
    clearInterval(keepAlive)
    teardown(exit, (code) => {
      if (receivedSignal || code !== 0) process.exit(code)
    })
  })
})

import { reaperActive, reaperEnv, registerOwner, thisOwner } from "./registry.js"

/**
 * vitest's setup file (in each worker, before each test file): names this worker in the
 * environment that every process it starts inherits, and tells the reaper to watch it. When the
 * worker is gone, the reaper ends what it started (see watchdog.mjs).
 */
if (reaperActive()) {
  process.env[reaperEnv.owner] = thisOwner()
  registerOwner()
}

/**
 * The unit lane's setup file (vitest.unit.config.ts): a test there starts no process. Every way
 * Node's child_process starts one throws instead, naming the rule, so that a test that does (a
 * platform, an executor, ffmpeg, npm) fails at once rather than outliving its file in a shared
 * worker, where no reaper ends it; such a file belongs in that config's `exclude`.
 */
import childProcess from "node:child_process"
import { syncBuiltinESMExports } from "node:module"

const refuse =
  (name: string) =>
  (..._args: ReadonlyArray<unknown>): never => {
    throw new Error(
      `child_process.${name}: a test in the unit lane (npm run test:unit) starts no process; list its file in vitest.unit.config.ts's exclude`
    )
  }

for (const name of ["spawn", "spawnSync", "exec", "execSync", "execFile", "execFileSync", "fork"] as const) {
  ;(childProcess as unknown as Record<string, unknown>)[name] = refuse(name)
}
syncBuiltinESMExports()

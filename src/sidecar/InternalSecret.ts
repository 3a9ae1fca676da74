/**
 * How the node agent's children (its sidecar, its executors) learn the internal secret: through
 * their environment, never their command line, which any user of the machine can read in
 * /proc/PID/cmdline. A child takes it out of its environment as it starts, so that the processes
 * it starts in turn (an executor's engine and workers) do not inherit what they have no use for.
 */

export const internalSecretEnvName = "CORNSERVE_INTERNAL_SECRET"

/** The environment entry that gives a child `secret`. */
export const internalSecretEnv = (secret: string): Readonly<Record<string, string>> => ({
  [internalSecretEnvName]: secret
})

/** The secret this process was given, removed from its environment; undefined when it was given none. */
export const takeInternalSecret = (): string | undefined => {
  const secret = process.env[internalSecretEnvName]
  delete process.env[internalSecretEnvName]
  return secret === undefined || secret.length === 0 ? undefined : secret
}

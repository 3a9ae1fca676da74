import { credentialHeaders } from "../../src/control/executor-calls/ExecutorHttp.js"
import { internalSecretEnv } from "../../src/sidecar/InternalSecret.js"

/**
 * The internal secret the executors of these tests are started with, as the node agent starts
 * them: in their environment. Every call but a health probe carries it, as the dispatcher's do.
 */
export const testSecret = "executor-tests-internal-secret"
export const secretEnv = internalSecretEnv(testSecret)
export const authorized = credentialHeaders(testSecret)

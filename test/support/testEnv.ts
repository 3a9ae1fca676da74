import { testAdminToken } from "./platform.js"

/**
 * vitest's setup file: every platform a test starts, and every CLI command it runs, share one admin
 * token through the environment, as an operator's would. (What `serve` does without one, making a
 * token in its state dir that the CLI reads, is tested on its own in test/integration/adminToken.test.ts.)
 */
process.env.CORNSERVE_ADMIN_TOKEN = testAdminToken

/**
 * CLI registrations skip the type check (seconds each, on two cores) where it is not what the test is
 * about; the tests of the check itself set CORNSERVE_APP_CHECK=on for their commands
 * (appTypes, readmeSnippets).
 */
process.env.CORNSERVE_APP_CHECK = "off"

/**
 * The tests' own ONNX Runtime sessions (transformers.js's, the reference, among them) run as the
 * platform's do, without ONNX Runtime's telemetry (src/executors/common/Sessions.ts); a test of the
 * platform's own default takes it out of the environment it starts `serve` with
 * (test/integration/cleanStop.test.ts).
 */
process.env.ORT_DISABLE_TELEMETRY ??= "1"

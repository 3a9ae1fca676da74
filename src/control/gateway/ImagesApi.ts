/**
 * OpenAI's image generations on an images app (its request is `ImageGenerationRequest`): the app's
 * `ImagesResponse` is checked and written as OpenAI's clients read it; anything else from the app,
 * a stream included, is the app's failure.
 */
import type { ServerResponse } from "node:http"
import * as Either from "effect/Either"
import * as Schema from "effect/Schema"
import { ImagesResponse } from "../../app-runtime/schemas/Images.js"
import { AppFailed } from "../errors.js"
import { type ReplyFormat, sendError, writeJson } from "./ReplyFormat.js"

const decodeImages = Schema.decodeUnknownEither(Schema.parseJson(ImagesResponse))

export const imagesFormat = (appId: string): ReplyFormat => {
  const failed = (response: ServerResponse, message: string) => sendError(response, new AppFailed({ appId, message }))
  return {
    value: (response, json) => {
      const decoded = decodeImages(json)
      if (Either.isLeft(decoded))
        return failed(
          response,
          "the app answered an image generation request with something other than an ImagesResponse"
        )
      return writeJson(response, JSON.stringify(decoded.right))
    },
    streamStart: () => undefined,
    chunk: () => true,
    end: (response) => failed(response, "the app streamed its answer to an image generation request"),
    streamError: (response, error) => sendError(response, error)
  }
}

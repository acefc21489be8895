// Engine code's name for the public Tokenizer API (servetune/tokenizer.h): a thin forward, so the engine's modules
// keep one include spelling while API users include the public header.
#pragma once

#include "servetune/tokenizer.h"

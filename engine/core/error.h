// Engine code's name for the public error types (servetune/error.h): a thin forward, so the engine's modules keep
// one include spelling while API users include the public header.
#pragma once

#include "servetune/error.h"

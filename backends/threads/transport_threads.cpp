#include "transport_threads.h"
